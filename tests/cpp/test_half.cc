// float16 / bfloat16 scalar conversions against references computed a different way: decoding
// from the bit fields with ldexp, and rounding by scaling to an integer and letting
// std::nearbyint (round-half-even in the default mode) pick the neighbour.
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "opforge/half.h"

namespace opforge {
namespace {

bool f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

// Decodes float16 bits by the IEEE formula.
double f16_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0x1f) v = mant ? std::numeric_limits<double>::quiet_NaN() : INFINITY;
  else if (exp == 0) v = std::ldexp(mant, -24);
  else v = std::ldexp(1024 + mant, exp - 25);
  return sign ? -v : v;
}

// Nearest float16 to the finite float f, ties to even, as bits.
uint16_t f16_reference(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;  // 65520 is halfway to 2^16: ties to even go to inf
  const int e = std::max(std::ilogb(a == 0 ? 1.0 : a), -14);  // quantum 2^(e-10) in this binade
  const double n = std::nearbyint(std::ldexp(a, 10 - e));  // exact scaling, then RNE
  if (e == -14 && n <= 1024) return sign | static_cast<uint16_t>(n);  // subnormal (or 2^-14)
  // n may have rounded up to 2048, the next binade's first value: the encoding carries over.
  return sign | static_cast<uint16_t>(((e + 15) << 10) + static_cast<int>(n) - 1024);
}

TEST(Float16, AllBitPatternsDecodeAndRoundTrip) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = to_float(float16{h});
    const uint16_t back = to_float16(f).bits;
    if (f16_is_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      ASSERT_TRUE(f16_is_nan(back)) << std::hex << i;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << "NaN sign lost for " << std::hex << i;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), f16_value(h)) << std::hex << i;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << i;  // -0 stays -0
    ASSERT_EQ(back, h) << std::hex << i;
  }
}

TEST(Float16, TiesRoundToEven) {
  // Every midpoint between neighbouring finite halves (exact in float: 12 significant bits),
  // and the floats just either side of it.
  for (uint16_t h = 0; h < 0x7bff; ++h) {
    const double lo = f16_value(h), hi = f16_value(h + 1);
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint16_t even = (h & 1) ? h + 1 : h;
    ASSERT_EQ(to_float16(mid).bits, even) << std::hex << h;
    ASSERT_EQ(to_float16(-mid).bits, even | 0x8000) << std::hex << h;
    ASSERT_EQ(to_float16(std::nextafter(mid, 0.0f)).bits, h) << std::hex << h;
    ASSERT_EQ(to_float16(std::nextafter(mid, INFINITY)).bits, h + 1) << std::hex << h;
  }
}

TEST(Float16, OverflowAndSpecials) {
  EXPECT_EQ(to_float16(65504.0f).bits, 0x7bff);  // largest half
  EXPECT_EQ(to_float16(std::nextafter(65520.0f, 0.0f)).bits, 0x7bff);
  EXPECT_EQ(to_float16(65520.0f).bits, 0x7c00);  // tie between 0x7bff (odd) and inf
  EXPECT_EQ(to_float16(-65520.0f).bits, 0xfc00);
  EXPECT_EQ(to_float16(1e10f).bits, 0x7c00);
  EXPECT_EQ(to_float16(std::numeric_limits<float>::max()).bits, 0x7c00);
  EXPECT_EQ(to_float16(INFINITY).bits, 0x7c00);
  EXPECT_EQ(to_float16(-INFINITY).bits, 0xfc00);
  EXPECT_EQ(to_float16(0.0f).bits, 0x0000);
  EXPECT_EQ(to_float16(-0.0f).bits, 0x8000);
  // Signalling NaN and a NaN whose payload sits below the bits a half keeps: still NaN.
  EXPECT_TRUE(f16_is_nan(to_float16(bits_to_float(0x7f800001u)).bits));
  EXPECT_TRUE(f16_is_nan(to_float16(bits_to_float(0xffc00000u)).bits));
}

TEST(Float16, Subnormals) {
  const float q = std::ldexp(1.0f, -24);  // smallest half subnormal
  EXPECT_EQ(to_float16(q).bits, 0x0001);
  EXPECT_EQ(to_float16(q / 2).bits, 0x0000);                                   // tie -> 0 (even)
  EXPECT_EQ(to_float16(std::nextafter(q / 2, 1.0f)).bits, 0x0001);
  EXPECT_EQ(to_float16(1.5f * q).bits, 0x0002);                                // tie -> 2 (even)
  EXPECT_EQ(to_float16(2.5f * q).bits, 0x0002);                                // tie -> 2 (even)
  EXPECT_EQ(to_float16(-3 * q).bits, 0x8003);
  EXPECT_EQ(to_float16(1023.5f * q).bits, 0x0400);  // tie rounds up into the normal range
  EXPECT_EQ(to_float16(std::numeric_limits<float>::denorm_min()).bits, 0x0000);
  EXPECT_EQ(to_float16(-std::numeric_limits<float>::denorm_min()).bits, 0x8000);
  EXPECT_EQ(to_float16(std::ldexp(1.0f, -14)).bits, 0x0400);  // smallest normal
}

TEST(Float16, RandomFloatsMatchReference) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> bits;
  // Half the draws near the half range, where every rounding branch is exercised.
  std::uniform_real_distribution<float> near(-70000.0f, 70000.0f);
  std::uniform_int_distribution<int> exps(-30, 17);
  for (int i = 0; i < 2'000'000; ++i) {
    float f;
    if (i % 3 == 0) f = bits_to_float(bits(rng));
    else if (i % 3 == 1) f = near(rng);
    else f = std::ldexp(near(rng) / 70000.0f, exps(rng));
    if (std::isnan(f)) {
      ASSERT_TRUE(f16_is_nan(to_float16(f).bits));
      continue;
    }
    ASSERT_EQ(to_float16(f).bits, f16_reference(f)) << std::hexfloat << f;
  }
}

TEST(BFloat16, AllBitPatternsDecodeAndRoundTrip) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float f = to_float(bfloat16{b});
    ASSERT_EQ(float_to_bits(f), i << 16);  // bfloat16 is the top half of a float
    const uint16_t back = to_bfloat16(f).bits;
    if (bf16_is_nan(b)) {
      ASSERT_TRUE(bf16_is_nan(back)) << std::hex << i;
      ASSERT_EQ(back & 0x8000, b & 0x8000) << std::hex << i;
    } else {
      ASSERT_EQ(back, b) << std::hex << i;
    }
  }
}

TEST(BFloat16, TiesRoundToEvenAndOverflow) {
  for (uint32_t b = 0; b < 0x7f7f; ++b) {  // every finite positive pair of neighbours
    const uint32_t mid = (b << 16) | 0x8000u;
    const uint16_t even = (b & 1) ? b + 1 : b;
    ASSERT_EQ(to_bfloat16(bits_to_float(mid)).bits, even) << std::hex << b;
    ASSERT_EQ(to_bfloat16(bits_to_float(mid | 0x80000000u)).bits, even | 0x8000) << std::hex << b;
    ASSERT_EQ(to_bfloat16(bits_to_float(mid - 1)).bits, b) << std::hex << b;
    ASSERT_EQ(to_bfloat16(bits_to_float(mid + 1)).bits, b + 1) << std::hex << b;
  }
  EXPECT_EQ(to_bfloat16(bits_to_float(0x7f7f7fffu)).bits, 0x7f7f);  // below the max's midpoint
  EXPECT_EQ(to_bfloat16(bits_to_float(0x7f7f8000u)).bits, 0x7f80);  // tie, odd max -> inf
  EXPECT_EQ(to_bfloat16(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(to_bfloat16(-INFINITY).bits, 0xff80);
  EXPECT_EQ(to_bfloat16(-0.0f).bits, 0x8000);
  // A NaN whose payload is only in the low 16 bits must not truncate to infinity.
  EXPECT_TRUE(bf16_is_nan(to_bfloat16(bits_to_float(0x7f800001u)).bits));
  EXPECT_TRUE(bf16_is_nan(to_bfloat16(bits_to_float(0xff80ffffu)).bits));
  EXPECT_EQ(to_bfloat16(bits_to_float(0xff80ffffu)).bits & 0x8000, 0x8000);
}

TEST(BFloat16, RandomFloatsMatchReference) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2'000'000; ++i) {
    const float f = bits_to_float(bits(rng));
    if (std::isnan(f)) {
      ASSERT_TRUE(bf16_is_nan(to_bfloat16(f).bits));
      continue;
    }
    // Scale so the kept bits are the integer part, then round half to even.
    const double a = std::fabs(static_cast<double>(f));
    uint16_t expected;
    if (a == 0) {
      expected = 0;
    } else {
      const int e = std::max(std::ilogb(a), -126);  // float subnormals share one quantum
      const double n = std::nearbyint(std::ldexp(a, 7 - e));
      const double v = std::ldexp(n, e - 7);  // exactly representable in bfloat16
      expected = v >= 0x1p128 ? 0x7f80  // rounded past the largest finite (or was inf)
                              : static_cast<uint16_t>(float_to_bits(static_cast<float>(v)) >> 16);
    }
    if (std::signbit(f)) expected |= 0x8000;
    ASSERT_EQ(to_bfloat16(f).bits, expected) << std::hexfloat << f;
  }
}

}  // namespace
}  // namespace opforge
