// A 16 x 16 transpose of 32-bit elements in AVX-512 registers, for the AMX products (packing
// operands into tiles' pair layout, turning blocks of sums around, transposing split g).
#pragma once

#if defined(__x86_64__) && defined(__linux__)
#include <hwy/base.h>
#include <immintrin.h>

#include <cstdint>

HWY_PUSH_ATTRIBUTES("avx512f")

namespace opforge::linear_act::amx {

// dst row j (dst_stride bytes apart) = 32-bit element j of src rows 0..15: a 16 x 16 transpose in
// registers. Packs P (a row's pair j of k + 2j, k + 2j + 1 to tile row j) and turns blocks of sums
// around (element by element, packing took 8% of a 2048^3 product, the turn 7% of 1024^3).
inline void transpose_16x16(const void* const src[16], char* dst, int64_t dst_stride) {
  __m512i r[16], t[16], u[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src[i]);
  for (int i = 0; i < 16; i += 2) {  // within 128-bit lanes: rows i, i + 1 interleaved
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {  // u[g + c], lane L: element 4L + c of rows g..g + 3
    u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // element 4L + c: lane L of u[c], u[4 + c], u[8 + c], u[12 + c]
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
    _mm512_storeu_si512(dst + c * dst_stride, _mm512_shuffle_i32x4(v0, v2, 0x88));
    _mm512_storeu_si512(dst + (4 + c) * dst_stride, _mm512_shuffle_i32x4(v0, v2, 0xdd));
    _mm512_storeu_si512(dst + (8 + c) * dst_stride, _mm512_shuffle_i32x4(v1, v3, 0x88));
    _mm512_storeu_si512(dst + (12 + c) * dst_stride, _mm512_shuffle_i32x4(v1, v3, 0xdd));
  }
}

}  // namespace opforge::linear_act::amx

HWY_POP_ATTRIBUTES

#endif
