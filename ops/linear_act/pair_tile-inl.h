// linear_act's bfloat16 micro-kernel on AVX512_BF16's dot products (vdpbf16ps): the packed-panel
// Gemm's Tile (gemm-inl.h) over operands of bfloat16 pairs, twice the float32 FMA's products per
// instruction; matmul-inl.h takes it for bfloat16 products while opforge::bf16_dot_enabled().
// Re-included once per Highway target; kPairTile says whether this target has it.
#if defined(OPFORGE_OPS_LINEAR_ACT_PAIR_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_OPS_LINEAR_ACT_PAIR_TILE_INL_H_
#undef OPFORGE_OPS_LINEAR_ACT_PAIR_TILE_INL_H_
#else
#define OPFORGE_OPS_LINEAR_ACT_PAIR_TILE_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>

#include "opforge/parallel.h"
#include "opforge/cpu/ahead.h"
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && (defined(__GNUC__) || defined(__clang__))
#include "ops/linear_act/amx_transpose.h"
#endif

HWY_BEFORE_NAMESPACE();
namespace opforge::gemm::HWY_NAMESPACE {

using cpu::Ahead;

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && (defined(__GNUC__) || defined(__clang__))
inline constexpr bool kPairTile = true;
// acc + the products of a's and b's bfloat16 pairs, lane by lane, by AVX512_BF16's vdpbf16ps
// (odd then even element, each added in float32, denormals flushed). Highway 1.0.3 has no target
// with that extension, so the kernels cannot name its intrinsic: the instruction is assembly.
HWY_INLINE __m512 DotPairs(__m512 acc, __m512i a, __m512i b) {
  asm("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// Tile over bfloat16 pairs (Operand<uint32_t>, see Gemm) for S rows of Q and panels of V vectors'
// rows: c[j * ldc + i] (+)= sum over steps p of panel[p][i] . q[j][p], each a pair of products,
// in float32.
template <int S, int V, bool kAhead, class D>
HWY_NOINLINE void PairTile(D, const uint32_t* HWY_RESTRICT panel, const uint32_t* const* q_rows, int64_t kc,
                           float* HWY_RESTRICT c, int64_t ldc, bool accumulate, Ahead ahead) {
  __m512 acc[V][S];
  const uint32_t* q[S];
  for (int j = 0; j < S; ++j) {
    q[j] = q_rows[j];
    for (int v = 0; v < V; ++v) acc[v][j] = accumulate ? _mm512_load_ps(c + j * ldc + 16 * v) : _mm512_setzero_ps();
  }
  const int64_t per_step = ahead.PerStep(kc);
  const char* const ahead_end = ahead.at + ahead.lines * 64;
  for (int64_t p = 0; p < kc; ++p) {
    if constexpr (kAhead) ahead.Issue(per_step, ahead_end);
    __m512i a[V];
    for (int v = 0; v < V; ++v) a[v] = _mm512_load_si512(panel + (p * V + v) * 16);
#pragma GCC unroll 8
    for (int j = 0; j < S; ++j) {
      const __m512i b = _mm512_set1_epi32(static_cast<int>(q[j][p]));
      for (int v = 0; v < V; ++v) acc[v][j] = DotPairs(acc[v][j], a[v], b);
    }
  }
  for (int j = 0; j < S; ++j)
    for (int v = 0; v < V; ++v) _mm512_store_ps(c + j * ldc + 16 * v, acc[v][j]);
}

// The rows of a bfloat16 operand that sit side by side (element (r, k) at data[r + k * ps]: W^T,
// g^T and x^T in the backward's products) as contiguous rows of pairs, out[r * K / 2 + p] =
// (X(r, 2p), X(r, 2p + 1)), K even, so PairTile can take them. 16 rows x 16 pairs at a time: each
// pair of columns widened and interleaved into a vector of 16 rows' pairs, the square then
// turned around in registers (amx_transpose.h).
inline void PairRows(const uint16_t* data, int64_t rows, int64_t ps, int64_t K, uint32_t* HWY_RESTRICT out) {
  const int64_t pairs = K / 2, groups = (rows + 15) / 16;
  const auto pair = [&](int64_t r, int64_t p) {
    return data[r + 2 * p * ps] | static_cast<uint32_t>(data[r + (2 * p + 1) * ps]) << 16;
  };
  parallel_for(groups, std::max<int64_t>(1, (1 << 14) / (16 * K + 1)), [&](int64_t begin, int64_t end) {
    alignas(64) uint32_t square[16][16];
    const void* src[16];
    for (int i = 0; i < 16; ++i) src[i] = square[i];
    for (int64_t g = begin; g < end; ++g) {
      const int64_t r0 = g * 16, n = std::min<int64_t>(16, rows - r0);
      int64_t p0 = 0;
      for (; n == 16 && p0 + 16 <= pairs; p0 += 16) {
        for (int i = 0; i < 16; ++i) {
          const uint16_t* even = data + r0 + 2 * (p0 + i) * ps;
          const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(even)));
          const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(even + ps)));
          _mm512_store_si512(square[i], _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
        linear_act::amx::transpose_16x16(src, reinterpret_cast<char*>(out + r0 * pairs + p0), pairs * 4);
      }
      for (int64_t i = 0; i < n; ++i)
        for (int64_t p = p0; p < pairs; ++p) out[(r0 + i) * pairs + p] = pair(r0 + i, p);
    }
  });
}
#else
inline constexpr bool kPairTile = false;
#endif

}  // namespace opforge::gemm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_OPS_LINEAR_ACT_PAIR_TILE_INL_H_
