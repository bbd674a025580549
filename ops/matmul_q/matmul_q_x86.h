// Shared by matmul_q's x86 kernels: matmul_q_x86.cc (weight tiles packed once, shared by many
// activation rows) and matmul_q_rows_x86.cc (a few rows, weights read where they lie).
// Included only on x86.
#pragma once

#include <hwy/base.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "opforge/cpu/ahead.h"
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

// The weight rows of a thread's next tile, prefetched over the blocks of the current one, a
// share per block (opforge/cpu/ahead.h says why). Empty after a thread's last tile.
class NextTile {
 public:
  NextTile() = default;
  // `bytes` from `data` on, over the blocks of a tile of nb blocks.
  NextTile(const uint8_t* data, int64_t bytes, int64_t nb) {
    const auto at = reinterpret_cast<uintptr_t>(data);
    ahead_ = {reinterpret_cast<const char*>(at & ~uintptr_t(63)), static_cast<int64_t>((at % 64 + bytes + 63) / 64)};
    end_ = ahead_.at + ahead_.lines * 64;
    per_block_ = ahead_.PerStep(nb);
  }
  void touch() { ahead_.Issue(per_block_, end_); }

 private:
  cpu::Ahead ahead_;
  const char* end_ = nullptr;
  int64_t per_block_ = 0;
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
HWY_PUSH_ATTRIBUTES("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

// t[g] lane c = bytes 4g..4g+3 of the 16 at cols[c] + at, for 16 columns: each 16-byte piece is
// loaded into the 128-bit lane of its column / 4 (columns i, i + 4, i + 8, i + 12 in z[i]), then
// transposed 4 x 4 within each 128-bit lane by unpacks.
inline void transpose_16(const uint8_t* const* cols, int64_t at, __m512i* t) {
  __m512i z[4];
  for (int i = 0; i < 4; ++i) {
    const auto load = [&](int c) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(cols[c] + at)); };
    z[i] = _mm512_inserti32x4(_mm512_castsi128_si512(load(i)), load(i + 4), 1);
    z[i] = _mm512_inserti32x4(_mm512_inserti32x4(z[i], load(i + 8), 2), load(i + 12), 3);
  }
  const __m512i a = _mm512_unpacklo_epi32(z[0], z[1]), b = _mm512_unpacklo_epi32(z[2], z[3]);
  const __m512i c = _mm512_unpackhi_epi32(z[0], z[1]), d = _mm512_unpackhi_epi32(z[2], z[3]);
  t[0] = _mm512_unpacklo_epi64(a, b);
  t[1] = _mm512_unpackhi_epi64(a, b);
  t[2] = _mm512_unpacklo_epi64(c, d);
  t[3] = _mm512_unpackhi_epi64(c, d);
}

// One block of 16 columns transposed for vpdpbusd: wq[g] lane c = quants 4g..4g+3 of column c's
// block at cols[c] + at (its quants, past the scale), made unsigned (Q8_0: q ^ 0x80; Q4_0: the raw
// nibbles, low ones in wq[0..3], high ones in wq[4..7]).
inline void block_groups_16(const uint8_t* const* cols, bool q8, int64_t at, __m512i* wq) {
  if (q8) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    transpose_16(cols, at, wq);
    transpose_16(cols, at + 16, wq + 4);
    for (int g = 0; g < 8; ++g) wq[g] = _mm512_xor_si512(wq[g], flip);
  } else {
    const __m512i nibbles = _mm512_set1_epi8(0x0f);
    transpose_16(cols, at, wq);
    for (int g = 0; g < 4; ++g) {
      wq[g + 4] = _mm512_and_si512(_mm512_srli_epi32(wq[g], 4), nibbles);
      wq[g] = _mm512_and_si512(wq[g], nibbles);
    }
  }
}

// The exact int32 block sums of 16 columns (wq: block_groups_16's) with one activation block x,
// less `offset` (the unsigned weights' offset times the sum of x's quants). Two chains halve the
// dependency on vpdpbusd's latency.
inline __m512i dot_block_16(const __m512i* wq, const int8_t* x, int32_t offset) {
  __m512i s0 = _mm512_set1_epi32(-offset), s1 = _mm512_setzero_si512();
  for (int j = 0; j < 8; j += 2) {
    s0 = _mm512_dpbusd_epi32(s0, wq[j], _mm512_set1_epi32(load_group(x + 4 * j)));
    s1 = _mm512_dpbusd_epi32(s1, wq[j + 1], _mm512_set1_epi32(load_group(x + 4 * j + 4)));
  }
  return _mm512_add_epi32(s0, s1);
}

// acc[r][0..15] += kb blocks (from block b0) of activation rows r0 .. r0 + R - 1 against a tile of 16
// columns, in block order: groups(b, wq) puts block b's groups in block_groups_16's layout into
// wq, pd[16 b ..] holds their scales as doubles. The packed kernel's groups come from its buffer,
// the unpacked one's are transposed from the weights where they lie.
template <int R, class Groups>
HWY_INLINE void sum_blocks_16(const Groups& groups, int64_t kb, const double* pd, const Activations& a, int64_t r0,
                              int64_t b0, int32_t offset, double* acc) {
  __m512d lo[R], hi[R];
  for (int r = 0; r < R; ++r) {
    lo[r] = _mm512_loadu_pd(acc + 16 * r);
    hi[r] = _mm512_loadu_pd(acc + 16 * r + 8);
  }
  for (int64_t b = 0; b < kb; ++b) {
    __m512i wq[8];
    groups(b, wq);
    const __m512d d_lo = _mm512_loadu_pd(pd + 16 * b), d_hi = _mm512_loadu_pd(pd + 16 * b + 8);
#pragma GCC unroll 8  // lo and hi stay in registers only if every r is its own code
    for (int r = 0; r < R; ++r) {
      const int64_t g = (r0 + r) * a.nb + b0 + b;
      add_block_16(dot_block_16(wq, a.q + g * quant::kBlock, offset * a.sum[g]), d_lo, d_hi, a.d[g], lo[r], hi[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_pd(acc + 16 * r, lo[r]);
    _mm512_storeu_pd(acc + 16 * r + 8, hi[r]);
  }
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

// t[g] lane c = bytes 4g..4g+3 of the 16 at cols[c] + at, for 8 columns: columns i and i + 4
// loaded into register i, then transposed 4 x 4 within each 128-bit lane.
inline void transpose_8(const uint8_t* const* cols, int64_t at, __m256i* t) {
  __m256i z[4];
  for (int i = 0; i < 4; ++i) {
    const auto load = [&](int c) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(cols[c] + at)); };
    z[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(load(i)), load(i + 4), 1);
  }
  const __m256i a = _mm256_unpacklo_epi32(z[0], z[1]), b = _mm256_unpacklo_epi32(z[2], z[3]);
  const __m256i c = _mm256_unpackhi_epi32(z[0], z[1]), d = _mm256_unpackhi_epi32(z[2], z[3]);
  t[0] = _mm256_unpacklo_epi64(a, b);
  t[1] = _mm256_unpackhi_epi64(a, b);
  t[2] = _mm256_unpacklo_epi64(c, d);
  t[3] = _mm256_unpackhi_epi64(c, d);
}

// One Q4_0 block of 8 columns transposed for pmaddubsw: wq[g] lane c = the nibbles of column c's
// quants 4g..4g+3 (wq[0..3]: the low nibbles, quants 0-15; wq[4..7]: the high ones, 16-31), each
// value + 8, as stored.
inline void q4_groups_8(const uint8_t* const* cols, int64_t at, __m256i* wq) {
  const __m256i nibbles = _mm256_set1_epi8(0x0f);
  transpose_8(cols, at, wq);
  for (int g = 0; g < 4; ++g) {
    wq[g + 4] = _mm256_and_si256(_mm256_srli_epi32(wq[g], 4), nibbles);
    wq[g] = _mm256_and_si256(wq[g], nibbles);
  }
}

// The exact int32 block sums of 8 Q4_0 columns (wq: q4_groups_8's) with one activation block x,
// less `offset` (8 times the sum of x's quants). pmaddubsw's pairs of nibble times quant (at most
// 2 * 15 * 127) are summed over the 8 groups in int16 (at most 30480: no saturation), then pairs
// of those in int32.
inline __m256i dot_block_q4_8(const __m256i* wq, const int8_t* x, int32_t offset) {
  __m256i s16 = _mm256_setzero_si256();
  for (int j = 0; j < 8; ++j)
    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(wq[j], _mm256_set1_epi32(load_group(x + 4 * j))));
  return _mm256_sub_epi32(_mm256_madd_epi16(s16, _mm256_set1_epi16(1)), _mm256_set1_epi32(offset));
}

HWY_POP_ATTRIBUTES

// Compilers before GCC 11 and clang 12 have no AVX-VNNI intrinsics: then the AVX2 target keeps
// pmaddubsw (cpu_has_avx_vnni() says no).
#if __has_include(<avxvnniintrin.h>)
#define OPFORGE_MATMUL_Q_AVX_VNNI 1
HWY_PUSH_ATTRIBUTES("avx2,fma,f16c,avxvnni")

// AVX-VNNI (vpdpbusd on 256-bit registers, without AVX-512: Intel's cores since Alder Lake): one
// block of 8 columns transposed as block_groups_16 does for 16, the weights made unsigned alike.
inline void block_groups_8(const uint8_t* const* cols, bool q8, int64_t at, __m256i* wq) {
  if (!q8) return q4_groups_8(cols, at, wq);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  transpose_8(cols, at, wq);
  transpose_8(cols, at + 16, wq + 4);
  for (int g = 0; g < 8; ++g) wq[g] = _mm256_xor_si256(wq[g], flip);
}

// dot_block_16's sums for 8 columns, in kChains chains. The unpacked kernel holds the block's 8
// groups in registers, and 16 registers then leave room for two rows' sums in one chain only (two
// chains ran two rows 30% slower); the packed kernel's rows take turns on the groups, where two
// chains ran 32 rows ~8% faster than one.
template <int kChains>
inline __m256i dot_block_8(const __m256i* wq, const int8_t* x, int32_t offset) {
  static_assert(kChains == 1 || kChains == 2);
  __m256i s[kChains];
  s[0] = _mm256_set1_epi32(-offset);
  if constexpr (kChains == 2) s[1] = _mm256_setzero_si256();
  for (int j = 0; j < 8; ++j)
    s[j % kChains] = _mm256_dpbusd_avx_epi32(s[j % kChains], wq[j], _mm256_set1_epi32(load_group(x + 4 * j)));
  return kChains == 2 ? _mm256_add_epi32(s[0], s[1]) : s[0];
}

// sum_blocks_16 for 8 columns (block_groups_8's layout), in kChains chains (dot_block_8).
template <int R, int kChains, class Groups>
HWY_INLINE void sum_blocks_8(const Groups& groups, int64_t kb, const double* pd, const Activations& a, int64_t r0,
                             int64_t b0, int32_t offset, double* acc) {
  __m256d lo[R], hi[R];
  for (int r = 0; r < R; ++r) {
    lo[r] = _mm256_loadu_pd(acc + 8 * r);
    hi[r] = _mm256_loadu_pd(acc + 8 * r + 4);
  }
  for (int64_t b = 0; b < kb; ++b) {
    __m256i wq[8];
    groups(b, wq);
    const __m256d d_lo = _mm256_loadu_pd(pd + 8 * b), d_hi = _mm256_loadu_pd(pd + 8 * b + 4);
#pragma GCC unroll 8  // lo and hi stay in registers only if every r is its own code
    for (int r = 0; r < R; ++r) {
      const int64_t g = (r0 + r) * a.nb + b0 + b;
      add_block_8(dot_block_8<kChains>(wq, a.q + g * quant::kBlock, offset * a.sum[g]), d_lo, d_hi, a.d[g], lo[r],
                  hi[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_pd(acc + 8 * r, lo[r]);
    _mm256_storeu_pd(acc + 8 * r + 4, hi[r]);
  }
}

HWY_POP_ATTRIBUTES
#endif  // AVX-VNNI intrinsics

}  // namespace opforge::matmul_q::x86
