// matmul_q's packed x86 kernels: AVX-512 VNNI (vpdpbusd, 16 columns a tile), AVX-VNNI (vpdpbusd
// on 256-bit registers, 8 columns) and AVX2 (pmaddubsw, 8 columns), each compiled for its own
// instruction set and called only where the CPU has it (Highway 1.0.3 has no int8 dot products,
// hence intrinsics).
//
// Layout: a tile of W weight rows (output columns) is repacked, per block, into 8 groups of
// W x 4 bytes: group g holds quants 4g..4g+3 of every column. One 32-bit lane then holds one
// column, and the activation's 4 quants of group g are broadcast to all lanes, so a vpdpbusd
// per group accumulates W exact dot products at once with no horizontal sums. The weight bytes
// are made unsigned for the u8 x s8 instructions (Q8_0: q ^ 0x80 = q + 128; Q4_0: the raw
// nibble q = value + 8) and offset * sum(x quants) is subtracted afterwards.
#include "ops/matmul_q/matmul_q.h"

#if defined(__x86_64__) || defined(__i386__)

#include "opforge/parallel.h"
#include "ops/matmul_q/matmul_q_x86.h"

namespace opforge::matmul_q {

namespace {

using namespace x86;

constexpr int64_t kRowChunk = 64;  // activation rows sharing one packed weight chunk

// Same driver for both kernels: tiles of K::kCols columns in parallel (each output is written
// by one thread, its blocks summed in order), rows in chunks, weights packed per block chunk.
template <class K>
void gemm_tiled(const Activations& a, const Weights& w, float* y) {
  constexpr int64_t W = K::kCols;
  const int64_t tiles = (w.n + W - 1) / W;
  const int64_t bytes = quant::block_bytes(w.format);
  const int32_t offset = weight_offset(w.format);
  parallel_for(tiles, 1, [&](int64_t t_begin, int64_t t_end) {
    // On the stack, not the heap: the same places every call (with the heap's, 9-16 rows' times
    // moved 10-25% with what the process had run before; on the stack 12-32 rows ran 10-23% faster).
    alignas(64) uint8_t pq[kBlockChunk * K::kMaxBlockBytes];
    alignas(64) uint16_t hs[kBlockChunk * W];
    alignas(64) double pd[kBlockChunk * W], acc[kRowChunk * W];
    const uint8_t* cols[W];  // each column's weight row, at block b0
    for (int64_t t = t_begin; t < t_end; ++t) {
      const int64_t c0 = t * W, valid = std::min(W, w.n - c0);
      NextTile next;
      if (t + 1 < t_end) next = NextTile(w.data + (c0 + W) * w.row_bytes, std::min(W, w.n - c0 - W) * w.row_bytes, a.nb);
      for (int64_t r0 = 0; r0 < a.m; r0 += kRowChunk) {
        const int64_t m = std::min(kRowChunk, a.m - r0);
        std::fill(acc, acc + m * W, 0.0);
        for (int64_t b0 = 0; b0 < a.nb; b0 += kBlockChunk) {
          const int64_t kb = std::min(kBlockChunk, a.nb - b0);
          tile_columns<W>(w, c0, b0, cols);
          copy_scales<W>(cols, bytes, kb, hs);
          K::pack(cols, w.format, kb, hs, pq, pd, next);  // next: spent after r0 == 0
          int64_t r = 0;
          for (; r + 4 <= m; r += 4) K::template accumulate<4>(pq, pd, kb, a, r0 + r, b0, offset, &acc[r * W]);
          for (; r < m; ++r) K::template accumulate<1>(pq, pd, kb, a, r0 + r, b0, offset, &acc[r * W]);
        }
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < valid; ++c) y[(r0 + r) * w.n + c0 + c] = static_cast<float>(acc[r * W + c]);
      }
    }
  });
}

HWY_PUSH_ATTRIBUTES("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

struct Vnni {
  static constexpr int64_t kCols = 16;
  static constexpr int64_t kMaxBlockBytes = 8 * 64;
  static int64_t block_bytes(quant::Format) { return kMaxBlockBytes; }

  static void pack(const uint8_t* const* cols, quant::Format format, int64_t kb, const uint16_t* hs, uint8_t* pq,
                   double* pd, NextTile& next) {
    const int64_t bytes = quant::block_bytes(format);
    __m512i t[8];
    for (int64_t b = 0; b < kb; ++b, pq += 512) {
      next.touch();
      block_groups_16(cols, format == quant::Format::q8_0, b * bytes + 2, t);
      for (int g = 0; g < 8; ++g) _mm512_storeu_si512(pq + 64 * g, t[g]);
    }
    scales_to_double_16(hs, kb, pd);
  }

  // acc[i][0..15] += the next kb blocks of rows r0 .. r0 + R - 1 against the packed tile.
  template <int R>
  static void accumulate(const uint8_t* pq, const double* pd, int64_t kb, const Activations& a, int64_t r0, int64_t b0,
                         int32_t offset, double* acc) {
    const auto groups = [pq](int64_t b, __m512i* wq) {
      for (int g = 0; g < 8; ++g) wq[g] = _mm512_loadu_si512(pq + 512 * b + 64 * g);
    };
    sum_blocks_16<R>(groups, kb, pd, a, r0, b0, offset, acc);
  }
};

HWY_POP_ATTRIBUTES
HWY_PUSH_ATTRIBUTES("avx2,fma,f16c")

// pmaddubsw sums byte pairs into int16 with saturation: Q4_0 nibbles (<= 15) times quants
// (|x| <= 127) stay far from it, summed over 8 groups too (<= 30480). Q8_0's unsigned bytes
// (<= 255) would not, so they are split into nibbles: q + 128 = 16 * hi + lo.
struct Avx2 {
  static constexpr int64_t kCols = 8;
  static constexpr int64_t kMaxBlockBytes = 16 * 32;
  static int64_t block_bytes(quant::Format f) { return f == quant::Format::q8_0 ? kMaxBlockBytes : 8 * 32; }

  static void pack(const uint8_t* const* cols, quant::Format format, int64_t kb, const uint16_t* hs, uint8_t* pq,
                   double* pd, NextTile& next) {
    const __m256i nibbles = _mm256_set1_epi8(0x0f), flip = _mm256_set1_epi8(static_cast<char>(0x80));
    const bool q8 = format == quant::Format::q8_0;
    const int64_t bytes = quant::block_bytes(format), step = block_bytes(format);
    __m256i t[8];
    for (int64_t b = 0; b < kb; ++b, pq += step) {
      next.touch();
      if (!q8) {  // q4_groups_8's layout
        q4_groups_8(cols, b * bytes + 2, t);
        for (int g = 0; g < 8; ++g) _mm256_storeu_si256(reinterpret_cast<__m256i*>(pq + 32 * g), t[g]);
        continue;
      }
      transpose_8(cols, b * bytes + 2, t);
      transpose_8(cols, b * bytes + 18, t + 4);
      for (int g = 0; g < 8; ++g) {  // group g's low nibbles at g, high nibbles at 8 + g
        const __m256i v = _mm256_xor_si256(t[g], flip);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(pq + 32 * g), _mm256_and_si256(v, nibbles));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(pq + 32 * (8 + g)),
                            _mm256_and_si256(_mm256_srli_epi32(v, 4), nibbles));
      }
    }
    scales_to_double_8(hs, kb, pd);
  }

  template <int R>
  static void accumulate(const uint8_t* pq, const double* pd, int64_t kb, const Activations& a, int64_t r0, int64_t b0,
                   int32_t offset, double* acc) {
    const bool q8 = offset == 128;
    const int64_t step = q8 ? 512 : 256;
    const __m256i ones = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);
    const auto group = [&](const uint8_t* p, int g) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * g));
    };
    __m256d lo[R], hi[R];
    for (int i = 0; i < R; ++i) {
      lo[i] = _mm256_loadu_pd(acc + 8 * i);
      hi[i] = _mm256_loadu_pd(acc + 8 * i + 4);
    }
    for (int64_t b = 0; b < kb; ++b, pq += step, pd += 8) {
      const __m256d d_lo = _mm256_loadu_pd(pd), d_hi = _mm256_loadu_pd(pd + 4);
      for (int i = 0; i < R; ++i) {
        const int64_t g = (r0 + i) * a.nb + b0 + b;
        const int8_t* x = a.q + g * quant::kBlock;
        if (!q8) {
          add_block_8(dot_block_q4_8(reinterpret_cast<const __m256i*>(pq), x, offset * a.sum[g]), d_lo, d_hi, a.d[g],
                      lo[i], hi[i]);
          continue;
        }
        // Q8_0's nibbles: each sum in int16 as for Q4_0, the high nibbles' weighted by 16 in int32.
        __m256i s16 = _mm256_setzero_si256(), h16 = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
          const __m256i xj = _mm256_set1_epi32(load_group(x + 4 * j));
          s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(group(pq, j), xj));
          h16 = _mm256_add_epi16(h16, _mm256_maddubs_epi16(group(pq, 8 + j), xj));
        }
        const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(s16, ones), _mm256_madd_epi16(h16, sixteen));
        add_block_8(_mm256_sub_epi32(s, _mm256_set1_epi32(offset * a.sum[g])), d_lo, d_hi, a.d[g], lo[i], hi[i]);
      }
    }
    for (int i = 0; i < R; ++i) {
      _mm256_storeu_pd(acc + 8 * i, lo[i]);
      _mm256_storeu_pd(acc + 8 * i + 4, hi[i]);
    }
  }
};

HWY_POP_ATTRIBUTES
#ifdef OPFORGE_MATMUL_Q_AVX_VNNI
HWY_PUSH_ATTRIBUTES("avx2,fma,f16c,avxvnni")

// Vnni's packing and products on 256-bit registers (AVX-VNNI): 8 columns a tile.
struct AvxVnni {
  static constexpr int64_t kCols = 8;
  static constexpr int64_t kMaxBlockBytes = 8 * 32;
  static int64_t block_bytes(quant::Format) { return kMaxBlockBytes; }

  static void pack(const uint8_t* const* cols, quant::Format format, int64_t kb, const uint16_t* hs, uint8_t* pq,
                   double* pd, NextTile& next) {
    const int64_t bytes = quant::block_bytes(format);
    __m256i t[8];
    for (int64_t b = 0; b < kb; ++b, pq += kMaxBlockBytes) {
      next.touch();
      block_groups_8(cols, format == quant::Format::q8_0, b * bytes + 2, t);
      for (int g = 0; g < 8; ++g) _mm256_storeu_si256(reinterpret_cast<__m256i*>(pq + 32 * g), t[g]);
    }
    scales_to_double_8(hs, kb, pd);
  }

  template <int R>
  static void accumulate(const uint8_t* pq, const double* pd, int64_t kb, const Activations& a, int64_t r0, int64_t b0,
                         int32_t offset, double* acc) {
    // The groups in registers (memory operands in the products ran 32 rows ~20% slower), two
    // chains (the rows take turns on the groups: ~8% faster than one at 32 rows).
    const auto groups = [pq](int64_t b, __m256i* wq) {
      const uint8_t* block = pq + kMaxBlockBytes * b;
      for (int g = 0; g < 8; ++g) wq[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * g));
    };
    sum_blocks_8<R, 2>(groups, kb, pd, a, r0, b0, offset, acc);
  }
};

HWY_POP_ATTRIBUTES
#endif

}  // namespace

bool cpu_has_avx512_vnni() {
  static const bool has = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return has;
}

void gemm_avx2(const Activations& a, const Weights& w, float* y) {
  a.m <= kMaxFewRows ? rows_avx2(a, w, y) : gemm_tiled<Avx2>(a, w, y);
}
#ifdef OPFORGE_MATMUL_Q_AVX_VNNI
bool cpu_has_avx_vnni() {
  static const bool has = __builtin_cpu_supports("avxvnni") && __builtin_cpu_supports("avx2") &&
                          __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return has;
}

void gemm_avx_vnni(const Activations& a, const Weights& w, float* y) {
  a.m <= kMaxFewRows ? rows_avx_vnni(a, w, y) : gemm_tiled<AvxVnni>(a, w, y);
}
#else
bool cpu_has_avx_vnni() { return false; }
void gemm_avx_vnni(const Activations& a, const Weights& w, float* y) { gemm_avx2(a, w, y); }
#endif
void gemm_vnni(const Activations& a, const Weights& w, float* y) {
  a.m <= kMaxFewRows ? rows_vnni(a, w, y) : gemm_tiled<Vnni>(a, w, y);
}

}  // namespace opforge::matmul_q
#endif
