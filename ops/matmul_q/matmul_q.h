// matmul_q's kernels below the activation quantization: the integer products of Q8_0
// activations with Q8_0 or Q4_0 weights. Every path computes, for each output,
//   y[r][c] = (float) sum over blocks b, in order, of double(s) * (double(dw) * double(dx)),
// s the block's exact int32 dot product and dw, dx the fp16 scales. Both products are exact in
// double (at most 19 + 22 significant bits), so FMA or not, vector or scalar, the only roundings
// are the ordered additions: every path gives the same bits.
#pragma once

#include <cstdint>

#include "opforge/cpu/ggml_quant.h"

namespace opforge::matmul_q {

// x quantized to Q8_0, split for the kernels: row r's block b is q[(r * nb + b) * 32 ...],
// with scale d[r * nb + b] (already rounded to fp16) and sum of its quants sum[r * nb + b].
struct Activations {
  const int8_t* q;
  const float* d;
  const int32_t* sum;
  int64_t m, nb;
};

// n rows of nb blocks in ggml's layout, contiguous.
struct Weights {
  const uint8_t* data;
  int64_t n, nb, row_bytes;
  quant::Format format;
};

// y: [m][n] float32, contiguous.
void gemm_scalar(const Activations& a, const Weights& w, float* y);
#if defined(__x86_64__) || defined(__i386__)
bool cpu_has_avx512_vnni();
// 8 columns a tile, pmaddubsw. Needs AVX2, FMA, F16C.
void gemm_avx2(const Activations& a, const Weights& w, float* y);
bool cpu_has_avx_vnni();
// 8 columns a tile, vpdpbusd on 256-bit registers: AVX-VNNI, which Intel's cores without AVX-512
// have since Alder Lake. Needs that and AVX2, FMA, F16C (cpu_has_avx_vnni()).
void gemm_avx_vnni(const Activations& a, const Weights& w, float* y);
// 16 columns a tile, vpdpbusd. Needs AVX-512 F/BW/VL and VNNI (cpu_has_avx512_vnni()).
void gemm_vnni(const Activations& a, const Weights& w, float* y);
// The same for products of up to kMaxFewRows rows (decoding, a small batch), the weights read
// where they lie instead of packed: matmul_q_rows_x86.cc. Measured on 4096 x 4096 and 4096 x 32768
// weights (Zen 5 VM), 1-8 rows there against packed: VNNI 5-30% faster, AVX2 5-25% (Q4_0 and Q8_0);
// past 8 rows the accumulators outgrow the registers and packing each tile once pays.
constexpr int64_t kMaxFewRows = 8;
void rows_avx2(const Activations& a, const Weights& w, float* y);
void rows_vnni(const Activations& a, const Weights& w, float* y);
void rows_avx_vnni(const Activations& a, const Weights& w, float* y);
#endif
#if defined(__aarch64__) && defined(__linux__)
bool cpu_has_arm_dotprod();
// 4 columns a tile, SDOT (Armv8.2 dot product). Needs cpu_has_arm_dotprod(): matmul_q_arm.cc.
void gemm_arm_dotprod(const Activations& a, const Weights& w, float* y);
#endif

}  // namespace opforge::matmul_q
