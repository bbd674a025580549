// Shared by matmul_q's x86 kernels: matmul_q_x86.cc (weight tiles packed once, shared by many
// activation rows) and matmul_q_rows_x86.cc (one or two rows, weights read where they lie).
// Included only on x86.
#pragma once

#include <hwy/base.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ops/matmul_q/matmul_q.h"

namespace opforge::matmul_q::x86 {

constexpr int64_t kBlockChunk = 32;  // blocks per chunk: a tile's scales and packed quants in L1

// The weights' quants are made unsigned for the u8 x s8 instructions (Q8_0: q ^ 0x80 = q + 128;
// Q4_0: the raw nibble q = value + 8); offset * sum(x quants) is subtracted afterwards.
inline int32_t weight_offset(quant::Format f) { return f == quant::Format::q8_0 ? 128 : 8; }

inline int32_t load_group(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return v;
}

// Brings the 64-byte line at p into the caches. Not _mm_prefetch: GCC counts a prefetch as no
// side effect, so a function holding only prefetches is found pure and a call to it that was not
// inlined early is deleted (GCC 12 removed a first version's, in a lambda, that way).
inline void prefetch_line(const void* p) { asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p))); }

// The weight rows of a thread's next tile, prefetched over the blocks of the current one (block
// b of nb touches the b-th slice of them): a tile reads 8 or 16 weight rows side by side, streams
// the hardware prefetchers follow poorly from DRAM, while consecutive tiles' rows lie one after
// another. Empty after a thread's last tile.
struct NextTile {
  const uint8_t* data = nullptr;
  int64_t bytes = 0, nb = 1;

  void touch(int64_t b) const {
    for (int64_t at = b * bytes / nb & ~int64_t(63); at < (b + 1) * bytes / nb; at += 64) prefetch_line(data + at);
  }
};

// cols[c]: column c0 + c's weight row at block b0. Columns past n repeat the last one; their
// results are never stored.
template <int64_t W>
void tile_columns(const Weights& w, int64_t c0, int64_t b0, const uint8_t** cols) {
  const int64_t valid = std::min(W, w.n - c0);
  for (int64_t c = 0; c < W; ++c)
    cols[c] = w.data + (c0 + std::min(c, valid - 1)) * w.row_bytes + b0 * quant::block_bytes(w.format);
}

// The fp16 scales of a chunk's blocks in a tile's columns, hs[b * W + c]: scalar copies, turned
// into doubles once the chunk's are all in (reading them back at once would stall on store
// forwarding). Gathers instead made one-row products 2.8x slower on this project's AMD EPYC
// (Zen 4), where gathers are slow; Intel parts with the Gather Data Sampling fix have slow ones too.
template <int64_t W>
void copy_scales(const uint8_t* const* cols, int64_t bytes, int64_t kb, uint16_t* hs) {
  for (int64_t b = 0; b < kb; ++b)
    for (int64_t c = 0; c < W; ++c) std::memcpy(hs + b * W + c, cols[c] + b * bytes, 2);
}

HWY_PUSH_ATTRIBUTES("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

// pd[b * 16 + c] = double(fp16 hs[b * 16 + c]) for kb blocks of 16 columns.
inline void scales_to_double_16(const uint16_t* hs, int64_t kb, double* pd) {
  for (int64_t b = 0; b < kb; ++b) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hs + 16 * b)));
    _mm512_storeu_pd(pd + 16 * b, _mm512_cvtps_pd(_mm512_castps512_ps256(d)));
    _mm512_storeu_pd(pd + 16 * b + 8, _mm512_cvtps_pd(_mm512_extractf32x8_ps(d, 1)));
  }
}

// One block of 16 columns into their double sums (lo: columns 0-7, hi: 8-15): the exact int32
// block sums times the weights' scales (d_lo, d_hi: as doubles) times the activation's dx,
// added in block order; both products are exact in double.
inline void add_block_16(__m512i sum, __m512d d_lo, __m512d d_hi, float dx, __m512d& lo, __m512d& hi) {
  const __m512d x = _mm512_set1_pd(static_cast<double>(dx));
  lo = _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(sum)), _mm512_mul_pd(d_lo, x), lo);
  hi = _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(sum, 1)), _mm512_mul_pd(d_hi, x), hi);
}

HWY_POP_ATTRIBUTES
HWY_PUSH_ATTRIBUTES("avx2,fma,f16c")

// The same for tiles of 8 columns.
inline void scales_to_double_8(const uint16_t* hs, int64_t kb, double* pd) {
  for (int64_t b = 0; b < kb; ++b) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hs + 8 * b)));
    _mm256_storeu_pd(pd + 8 * b, _mm256_cvtps_pd(_mm256_castps256_ps128(d)));
    _mm256_storeu_pd(pd + 8 * b + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(d, 1)));
  }
}

// The same for 8 columns (lo: 0-3, hi: 4-7).
inline void add_block_8(__m256i sum, __m256d d_lo, __m256d d_hi, float dx, __m256d& lo, __m256d& hi) {
  const __m256d x = _mm256_set1_pd(static_cast<double>(dx));
  lo = _mm256_fmadd_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(sum)), _mm256_mul_pd(d_lo, x), lo);
  hi = _mm256_fmadd_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(sum, 1)), _mm256_mul_pd(d_hi, x), hi);
}

HWY_POP_ATTRIBUTES

}  // namespace opforge::matmul_q::x86
