// matmul_q's x86 kernels for one to eight activation rows (decoding a token, a small batch;
// matmul_q.h says how many each kernel takes): each weight byte meets a few rows, so repacking
// tiles once into a buffer as matmul_q_x86.cc does costs more than it saves. Here a tile's
// columns are read where they lie, one block at a time, and mostly transposed in registers into
// the layout that packing writes (one column per 32-bit lane, 4 quants of a group in it): each
// row's exact int32 block sums then come from 8 dot product instructions with the row's 4 quants
// of each group broadcast (AVX-512 VNNI: 16 columns; AVX-VNNI: 8; AVX2: pmaddubsw, Q4_0 only).
// The rest keep a column's block in a vector as it is, and a tree of unpacks and adds folds each
// column's partial sums into a lane of its own: AVX2's Q8_0 (pmaddubsw would saturate on its
// unsigned bytes, so it multiplies |w| by x with w's sign, and cannot add two groups' pairs in
// int16), and AVX-512's Q8_0 for one or two rows (fewer instructions there than two transposes).
// Either way the sums are the exact int32 block sums that the packed kernels and the scalar
// reference compute, scaled and summed in double in block order as they do, so every path gives
// the same bits.
//
// A tile's columns are 8 or 16 weight rows read side by side, one stream each, which the
// hardware prefetchers follow poorly from DRAM; the weight rows of consecutive tiles lie one after
// another, so while a tile is multiplied the next one is prefetched in memory order, a slice per
// block. With weights larger than the caches (4096 x 32768) that took one row from 3.0 to 1.8 ms
// (Q4_0, VNNI) and 4.1 to 2.4 ms (Q4_0, AVX2) on the Zen 5 VM, from behind ggml to ahead of it.
#include "ops/matmul_q/matmul_q.h"

#if defined(__x86_64__) || defined(__i386__)
#include "opforge/parallel.h"
#include "ops/matmul_q/matmul_q_x86.h"

namespace opforge::matmul_q {

namespace {

using namespace x86;

// Tiles of K::kCols columns in parallel, each tile's blocks in chunks: the chunk's scales
// copied and turned into doubles first, then its blocks' products for the R rows.
template <class K, int R>
void rows_tiled(const Activations& a, const Weights& w, float* y) {
  constexpr int64_t W = K::kCols;
  const int64_t tiles = (w.n + W - 1) / W, bytes = quant::block_bytes(w.format);
  parallel_for(tiles, 1, [&](int64_t t_begin, int64_t t_end) {
    alignas(64) uint16_t hs[kBlockChunk * W];
    alignas(64) double pd[kBlockChunk * W];
    const uint8_t* cols[W];
    for (int64_t t = t_begin; t < t_end; ++t) {
      alignas(64) double acc[R * W] = {};
      NextTile next;
      if (t + 1 < t_end)
        next = NextTile(w.data + (t + 1) * W * w.row_bytes, std::min(W, w.n - (t + 1) * W) * w.row_bytes, a.nb);
      for (int64_t b0 = 0; b0 < a.nb; b0 += kBlockChunk) {
        const int64_t kb = std::min(kBlockChunk, a.nb - b0);
        tile_columns<W>(w, t * W, b0, cols);
        copy_scales<W>(cols, bytes, kb, hs);
        K::scales(hs, kb, pd);
        if (w.format == quant::Format::q8_0)  // one loop per format: a run-time choice in it cost 4-6%
          K::template dot<R, true>(cols, kb, pd, a, b0, acc, next);
        else
          K::template dot<R, false>(cols, kb, pd, a, b0, acc, next);
      }
      for (int r = 0; r < R; ++r)
        for (int64_t c = t * W; c < std::min(w.n, (t + 1) * W); ++c)
          y[r * w.n + c] = static_cast<float>(acc[r * W + c - t * W]);
    }
  });
}

HWY_PUSH_ATTRIBUTES("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

struct Vnni {
  static constexpr int64_t kCols = 16;
  static void scales(const uint16_t* hs, int64_t kb, double* pd) { scales_to_double_16(hs, kb, pd); }

  // Q8_0 for one or two rows: each column's whole block in half a register (column p = (i & 3) +
  // 8 * (i >> 2) in register i's low half, p + 4 in its high half), whose 8 lanes of partial sums
  // fold() adds up: fewer instructions than transposing (2 transposes for 32 bytes) where the
  // block meets one or two rows (from DRAM one row took 3.1 ms this way, 3.4 transposed).
  static int pair(int i) { return (i & 3) + 8 * (i >> 2); }
  // s[i]'s 16 lanes of partial sums -> lane c = column c's sum.
  static __m512i fold(const __m512i* s) {
    __m512i u[4], v[2];
    for (int j = 0; j < 4; ++j)
      u[j] = _mm512_add_epi32(_mm512_unpacklo_epi32(s[2 * j], s[2 * j + 1]),
                              _mm512_unpackhi_epi32(s[2 * j], s[2 * j + 1]));
    for (int j = 0; j < 2; ++j)
      v[j] = _mm512_add_epi32(_mm512_unpacklo_epi64(u[2 * j], u[2 * j + 1]),
                              _mm512_unpackhi_epi64(u[2 * j], u[2 * j + 1]));
    return _mm512_add_epi32(_mm512_shuffle_i64x2(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i64x2(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
  }

  template <int R, bool kQ8>
  static void dot(const uint8_t* const* cols, int64_t kb, const double* pd, const Activations& a, int64_t b0,
                  double* acc, NextTile& next) {
    constexpr auto format = kQ8 ? quant::Format::q8_0 : quant::Format::q4_0;
    const int64_t bytes = quant::block_bytes(format);
    const int32_t offset = weight_offset(format);
    if constexpr (kQ8 && R <= 2) return dot_folded<R>(cols, kb, pd, a, b0, acc, next);
    const auto groups = [&](int64_t b, __m512i* wq) {
      next.touch();
      block_groups_16(cols, kQ8, b * bytes + 2, wq);
    };
    sum_blocks_16<R>(groups, kb, pd, a, 0, b0, offset, acc);
  }

  template <int R>
  static void dot_folded(const uint8_t* const* cols, int64_t kb, const double* pd, const Activations& a, int64_t b0,
                         double* acc, NextTile& next) {
    const int64_t bytes = quant::block_bytes(quant::Format::q8_0);
    const int32_t offset = weight_offset(quant::Format::q8_0);
    __m512d lo[R], hi[R];
    for (int r = 0; r < R; ++r) {
      lo[r] = _mm512_loadu_pd(acc + 16 * r);
      hi[r] = _mm512_loadu_pd(acc + 16 * r + 8);
    }
    for (int64_t b = 0; b < kb; ++b) {
      next.touch();
      const __m512d d_lo = _mm512_loadu_pd(pd + 16 * b), d_hi = _mm512_loadu_pd(pd + 16 * b + 8);
      __m512i v[8];
      for (int i = 0; i < 8; ++i) {
        const auto load = [&](int c) {
          return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cols[c] + b * bytes + 2));
        };
        v[i] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(load(pair(i))), load(pair(i) + 4), 1),
                                _mm512_set1_epi8(static_cast<char>(0x80)));
      }
      for (int r = 0; r < R; ++r) {
        const int64_t g = r * a.nb + b0 + b;
        const __m512i x =
            _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + g * quant::kBlock)));
        __m512i s[8];
        for (int i = 0; i < 8; ++i) s[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[i], x);
        const __m512i sums = _mm512_sub_epi32(fold(s), _mm512_set1_epi32(offset * a.sum[g]));
        add_block_16(sums, d_lo, d_hi, a.d[g], lo[r], hi[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      _mm512_storeu_pd(acc + 16 * r, lo[r]);
      _mm512_storeu_pd(acc + 16 * r + 8, hi[r]);
    }
  }
};

HWY_POP_ATTRIBUTES
HWY_PUSH_ATTRIBUTES("avx2,fma,f16c")

// Q4_0: transposed in registers as VNNI's (q4_groups_8, dot_block_q4_8). Q8_0: pmaddubsw multiplies
// unsigned by signed bytes and adds pairs into int16 with saturation, so it goes in as |w| (-128
// included: 128 unsigned) times x carrying w's sign (x from opforge's quantizer, |x| <= 127):
// pairs up to 2 * 128 * 127, no saturation, but no room to add two groups' pairs in int16 either,
// so a column's block stays in a vector as it is and the fold below sums its lanes.
struct Avx2 {
  static constexpr int64_t kCols = 8;
  static void scales(const uint16_t* hs, int64_t kb, double* pd) { scales_to_double_8(hs, kb, pd); }

  // Eight registers of 8 lanes, one column each -> lane c = column c's sum.
  static __m256i fold(const __m256i* s) {
    __m256i u[4], v[2];
    for (int j = 0; j < 4; ++j)
      u[j] = _mm256_add_epi32(_mm256_unpacklo_epi32(s[2 * j], s[2 * j + 1]),
                              _mm256_unpackhi_epi32(s[2 * j], s[2 * j + 1]));
    for (int j = 0; j < 2; ++j)
      v[j] = _mm256_add_epi32(_mm256_unpacklo_epi64(u[2 * j], u[2 * j + 1]),
                              _mm256_unpackhi_epi64(u[2 * j], u[2 * j + 1]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(v[0], v[1], 0x20), _mm256_permute2x128_si256(v[0], v[1], 0x31));
  }

  // A block's 8 exact int32 column sums with activation block g.
  static __m256i q4_sums(const __m256i* wq, const Activations& a, int64_t g) {
    return dot_block_q4_8(wq, a.q + g * quant::kBlock, 8 * a.sum[g]);
  }
  static __m256i q8_sums(const __m256i* v, const Activations& a, int64_t g) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + g * quant::kBlock));
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s[8];
    for (int c = 0; c < 8; ++c)
      s[c] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v[c]), _mm256_sign_epi8(x, v[c])), ones);
    return fold(s);
  }

  template <int R, bool kQ8>
  static void dot(const uint8_t* const* cols, int64_t kb, const double* pd, const Activations& a, int64_t b0,
                  double* acc, NextTile& next) {
    const int64_t bytes = quant::block_bytes(kQ8 ? quant::Format::q8_0 : quant::Format::q4_0);
    __m256d lo[R], hi[R];
    for (int r = 0; r < R; ++r) {
      lo[r] = _mm256_loadu_pd(acc + 8 * r);
      hi[r] = _mm256_loadu_pd(acc + 8 * r + 4);
    }
    for (int64_t b = 0; b < kb; ++b) {
      next.touch();
      __m256i v[8];  // Q4_0: q4_groups_8's groups; Q8_0: column c's 32 quants in v[c]
      if constexpr (kQ8) {
        for (int c = 0; c < 8; ++c) v[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cols[c] + b * bytes + 2));
      } else {
        q4_groups_8(cols, b * bytes + 2, v);
      }
      const __m256d d_lo = _mm256_loadu_pd(pd + 8 * b), d_hi = _mm256_loadu_pd(pd + 8 * b + 4);
#pragma GCC unroll 8  // lo and hi stay in registers only if every r is its own code
      for (int r = 0; r < R; ++r) {
        const int64_t g = r * a.nb + b0 + b;
        add_block_8(kQ8 ? q8_sums(v, a, g) : q4_sums(v, a, g), d_lo, d_hi, a.d[g], lo[r], hi[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_pd(acc + 8 * r, lo[r]);
      _mm256_storeu_pd(acc + 8 * r + 4, hi[r]);
    }
  }
};

HWY_POP_ATTRIBUTES
#ifdef OPFORGE_MATMUL_Q_AVX_VNNI
HWY_PUSH_ATTRIBUTES("avx2,fma,f16c,avxvnni")

// Vnni's transposed blocks on 256-bit registers (AVX-VNNI): 8 columns a tile, both formats alike.
struct AvxVnni {
  static constexpr int64_t kCols = 8;
  static void scales(const uint16_t* hs, int64_t kb, double* pd) { scales_to_double_8(hs, kb, pd); }

  template <int R, bool kQ8>
  static void dot(const uint8_t* const* cols, int64_t kb, const double* pd, const Activations& a, int64_t b0,
                  double* acc, NextTile& next) {
    constexpr auto format = kQ8 ? quant::Format::q8_0 : quant::Format::q4_0;
    const int64_t bytes = quant::block_bytes(format);
    const auto groups = [&](int64_t b, __m256i* wq) {
      next.touch();
      block_groups_8(cols, kQ8, b * bytes + 2, wq);
    };
    sum_blocks_8<R, 1>(groups, kb, pd, a, 0, b0, weight_offset(format), acc);
  }
};

HWY_POP_ATTRIBUTES
#endif

// rows_tiled for R = a.m, 1 <= a.m <= kMaxFewRows (matmul_q.h).
template <class K, int R = 1>
void rows(const Activations& a, const Weights& w, float* y) {
  if constexpr (R < kMaxFewRows) {
    if (a.m > R) return rows<K, R + 1>(a, w, y);
  }
  rows_tiled<K, R>(a, w, y);
}

}  // namespace

void rows_avx2(const Activations& a, const Weights& w, float* y) { rows<Avx2>(a, w, y); }
void rows_vnni(const Activations& a, const Weights& w, float* y) { rows<Vnni>(a, w, y); }
#ifdef OPFORGE_MATMUL_Q_AVX_VNNI
void rows_avx_vnni(const Activations& a, const Weights& w, float* y) { rows<AvxVnni>(a, w, y); }
#endif

}  // namespace opforge::matmul_q
#endif
