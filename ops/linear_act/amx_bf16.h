// linear_act's bfloat16 product on Intel AMX tiles (amx_bf16.cc): the same sums as the SIMD
// product, float32 accumulation over k in order, at several times its speed on CPUs that have
// AMX. matmul-inl.h calls it under the AVX3 target while opforge::amx_enabled().
#pragma once

#include <cstdint>

namespace opforge::linear_act::amx {

// Element (r, p) at data[r * rs + (p >> shift) * ps], r < rows, as bfloat16 bits. shift = 1
// repeats each value twice along p (split_gemm's other operand).
struct Bf16Operand {
  const uint16_t* data;
  int64_t rows, rs, ps;
  int shift = 0;
};

// Receives each finished block of sums, C[q0 + i][p0 + j] for i < nq, j < np (both at most
// kBlock): at c[i * ld + j], or with p_rows at c[j * ld + i] (one row per row of P). c is 64-byte
// aligned, ld a multiple of 16, and the block may be overwritten. Called from the thread pool's
// threads, each block once.
class BlockSink {
 public:
  virtual ~BlockSink() = default;
  virtual void operator()(int64_t q0, int64_t p0, float* c, int64_t ld, int64_t nq, int64_t np) const = 0;
};

inline constexpr int64_t kBlock = 32;

// C[q][p] = sum_k Q(q, k) * P(p, k) for q < Q.rows, p < P.rows, k < K, summed in float32 in k
// order, two k at a time (the tile instruction's arithmetic: products exact, denormal inputs
// and results flushed to zero).
// Results do not depend on the thread count. P is packed (any strides); Q is copied a block of rows at a
// time, once per 512 rows of P. Needs amx_enabled(); K >= 1.
void gemm(const Bf16Operand& P, const Bf16Operand& Q, int64_t K, bool p_rows, const BlockSink& sink);

// The backward's products, whose left factor is float32: C[a][b] = sum_p G(a, p) * V(b, p) for
// G(a, p) at g[a * K + p], or with g_transposed at g[p * rows + a] (a < rows, p < K), and V
// bfloat16 (shift 0). Each G value goes in as two bfloat16 parts, hi (rounded) and lo (the
// rest, rounded; 0 where hi is infinite): 16 of float's 24 bits, as the CUDA backward splits
// it, in one tile product of pairs (hi, lo) x (v, v). Blocks reach sink as in gemm without
// p_rows (rows along a). Needs amx_enabled(); K >= 1.
void split_gemm(const float* g, int64_t rows, int64_t K, bool g_transposed, const Bf16Operand& V,
                const BlockSink& sink);

}  // namespace opforge::linear_act::amx
