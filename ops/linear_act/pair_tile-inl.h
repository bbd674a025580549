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

#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace opforge::gemm::HWY_NAMESPACE {

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && (defined(__GNUC__) || defined(__clang__))
inline constexpr bool kPairTile = true;
// acc + the products of a's and b's bfloat16 pairs, lane by lane, by AVX512_BF16's vdpbf16ps
// (odd then even element, each added in float32, denormals flushed). Highway 1.0.3 has no target
// with that extension, so the kernels cannot name its intrinsic: the instruction is assembly.
HWY_INLINE __m512 DotPairs(__m512 acc, __m512i a, __m512i b) {
  asm("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// Tile over bfloat16 pairs (Operand<uint32_t>, see Gemm) for S rows of Q: c[j * ldc + i] (+)= sum
// over steps p of panel[p][i] . q[j][p], each a pair of products, in float32.
template <int S, class D>
HWY_NOINLINE void PairTile(D, const uint32_t* HWY_RESTRICT panel, const uint32_t* const* q_rows, int64_t kc,
                           float* HWY_RESTRICT c, int64_t ldc, bool accumulate) {
  __m512 acc0[S], acc1[S];
  const uint32_t* q[S];
  for (int j = 0; j < S; ++j) {
    q[j] = q_rows[j];
    acc0[j] = accumulate ? _mm512_load_ps(c + j * ldc) : _mm512_setzero_ps();
    acc1[j] = accumulate ? _mm512_load_ps(c + j * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < kc; ++p) {
    const __m512i a0 = _mm512_load_si512(panel + p * 32), a1 = _mm512_load_si512(panel + p * 32 + 16);
#pragma GCC unroll 8
    for (int j = 0; j < S; ++j) {
      const __m512i b = _mm512_set1_epi32(static_cast<int>(q[j][p]));
      acc0[j] = DotPairs(acc0[j], a0, b);
      acc1[j] = DotPairs(acc1[j], a1, b);
    }
  }
  for (int j = 0; j < S; ++j) {
    _mm512_store_ps(c + j * ldc, acc0[j]);
    _mm512_store_ps(c + j * ldc + 16, acc1[j]);
  }
}
#else
inline constexpr bool kPairTile = false;
#endif

}  // namespace opforge::gemm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_OPS_LINEAR_ACT_PAIR_TILE_INL_H_
