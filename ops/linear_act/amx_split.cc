// linear_act_backward's bfloat16 products on AMX tiles (amx::split_gemm): the float32 factor g
// goes in as bfloat16 pairs (hi, lo), the other operand with each value twice along the sum
// (Bf16Operand.shift = 1), so one tile product adds hi * v + lo * v.
#include "ops/linear_act/amx_bf16.h"

#if defined(__x86_64__) && defined(__linux__)
#include <hwy/base.h>
#include <immintrin.h>

#include <algorithm>

#include "opforge/cpu/scratch.h"
#include "opforge/parallel.h"
#include "ops/linear_act/amx_transpose.h"

namespace opforge::linear_act::amx {

namespace {

HWY_PUSH_ATTRIBUTES("avx512f")

// float32 bits rounded to bfloat16 bits (to nearest even; NaN stays NaN), in the low half.
__m512i round_to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

// 16 floats as (hi, lo) bfloat16 pairs, hi in the low half of each 32-bit lane.
__m512i split_pairs(__m512 v) {
  const __m512i hi = round_to_bf16(v);
  const __m512 hi_value = _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16));
  const __mmask16 infinite = _mm512_cmpeq_epi32_mask(_mm512_and_si512(hi, _mm512_set1_epi32(0x7fff)),
                                                    _mm512_set1_epi32(0x7f80));
  const __m512 rest = _mm512_maskz_sub_ps(static_cast<__mmask16>(~infinite), v, hi_value);
  return _mm512_or_si512(hi, _mm512_slli_epi32(round_to_bf16(rest), 16));
}

// pairs[i] = split_pairs(g[i]) for i < n.
void split_row(const float* g, int64_t n, uint32_t* pairs) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_si512(pairs + i, split_pairs(_mm512_loadu_ps(g + i)));
  if (i < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_epi32(pairs + i, tail, split_pairs(_mm512_maskz_loadu_ps(tail, g + i)));
  }
}

HWY_POP_ATTRIBUTES

}  // namespace

void split_gemm(const float* g, int64_t rows, int64_t K, bool g_transposed, const Bf16Operand& V,
                const BlockSink& sink) {
  // pairs[a * K + p] = G(a, p)'s (hi, lo): a bfloat16 operand with 2K values per row.
  const cpu::BackendBuffer<uint32_t> pairs(rows * K);
  if (!g_transposed) {
    parallel_for(rows, std::max<int64_t>(1, (1 << 14) / (K + 1)), [&](int64_t begin, int64_t end) {
      for (int64_t a = begin; a < end; ++a) split_row(g + a * K, K, pairs.get() + a * K);
    });
  } else {
    // Split as stored (K rows of `rows`), then turned around 16 x 16 at a time.
    const cpu::BackendBuffer<uint32_t> stored(K * rows);
    parallel_for(K, std::max<int64_t>(1, (1 << 14) / (rows + 1)), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) split_row(g + p * rows, rows, stored.get() + p * rows);
    });
    const int64_t a_blocks = (rows + 15) / 16, p_blocks = (K + 15) / 16;
    parallel_for(a_blocks * p_blocks, 16, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t a0 = item / p_blocks * 16, p0 = item % p_blocks * 16;
        if (a0 + 16 <= rows && p0 + 16 <= K) {
          const void* src[16];
          for (int64_t i = 0; i < 16; ++i) src[i] = stored.get() + (p0 + i) * rows + a0;
          transpose_16x16(src, reinterpret_cast<char*>(pairs.get() + a0 * K + p0), K * sizeof(uint32_t));
        } else {
          for (int64_t a = a0; a < std::min(rows, a0 + 16); ++a)
            for (int64_t p = p0; p < std::min(K, p0 + 16); ++p) pairs.get()[a * K + p] = stored.get()[p * rows + a];
        }
      }
    });
  }
  const Bf16Operand Q{reinterpret_cast<const uint16_t*>(pairs.get()), rows, 2 * K, 1};
  Bf16Operand P = V;
  P.shift = 1;
  gemm(P, Q, 2 * K, false, sink);
}

}  // namespace opforge::linear_act::amx

#else

#include "opforge/error.h"

namespace opforge::linear_act::amx {
void split_gemm(const float*, int64_t, int64_t, bool, const Bf16Operand&, const BlockSink&) {
  fail(ErrorKind::runtime, "linear_act_backward(): the AMX product needs an x86-64 Linux build");
}
}  // namespace opforge::linear_act::amx

#endif
