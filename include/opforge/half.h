// Scalar float16 / bfloat16 conversions (round to nearest even, NaN preserved), for tails
// and strided paths the SIMD code does not cover.
#pragma once

#include <cstdint>
#include <cstring>

namespace opforge {

struct float16 { uint16_t bits; };
struct bfloat16 { uint16_t bits; };

inline float bits_to_float(uint32_t bits) { float f; std::memcpy(&f, &bits, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }

inline float to_float(bfloat16 h) { return bits_to_float(uint32_t{h.bits} << 16); }

inline bfloat16 to_bfloat16(float f) {
  uint32_t bits = float_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((bits >> 16) | 0x40)};
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return {static_cast<uint16_t>(bits >> 16)};
}

inline float to_float(float16 h) {
  const uint32_t sign = uint32_t{h.bits & 0x8000u} << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  const uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
  // Subnormal: mant * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -magnitude : magnitude;
}

inline float16 to_float16(float f) {
  const uint32_t bits = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return {static_cast<uint16_t>(sign | 0x7e00u)};  // NaN
  if (abs >= 0x477ff000u) return {static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: scale so the integer part holds the 10-bit mantissa.
    // Adding 0.5f forces hardware round-to-nearest-even at the right bit.
    const float scaled = bits_to_float(abs) + 0.5f;
    return {static_cast<uint16_t>(sign | static_cast<uint16_t>(float_to_bits(scaled) - 0x3f000000u))};
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return {static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13))};
}

}  // namespace opforge
