// matmul_q's Arm path: each block's integer dot product on SDOT (vdotq_s32, Armv8.2's
// dot-product extension: four 4-byte dot products a lane, what ggml uses on Arm), for CPUs that
// have it (Linux's HWCAP_ASIMDDP: Neoverse N1 and later, Cortex-A55/A76 and later, Apple M1 and
// later); others keep the scalar loop. Sums as gemm_scalar does (each output's blocks in order,
// in double), so the same bits. Compiled for that extension by function attribute only: the
// rest of opforge stays Armv8.0.
#if defined(__aarch64__) && defined(__linux__)
#include <arm_neon.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>

#include <algorithm>
#include <vector>

#include "opforge/parallel.h"
#include "ops/matmul_q/matmul_q.h"

namespace opforge::matmul_q {

bool cpu_has_arm_dotprod() {
  static const bool has = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
  return has;
}

namespace {

// arm_neon.h declares SDOT's intrinsics for Armv8.2 with the extension; a function inlining them
// must target at least that. Every CPU with SDOT implements Armv8.2.
#define OPFORGE_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))

// A weight block's 32 quants as int8 in the order of the activations' 32: Q8_0's bytes as they
// are; Q4_0's low nibbles (quants 0-15) then high nibbles (16-31), each minus 8.
OPFORGE_DOTPROD inline void decode(const uint8_t* qs, bool q8, int8x16_t& first, int8x16_t& second) {
  if (q8) {
    first = vld1q_s8(reinterpret_cast<const int8_t*>(qs));
    second = vld1q_s8(reinterpret_cast<const int8_t*>(qs) + 16);
    return;
  }
  const uint8x16_t bytes = vld1q_u8(qs);
  const int8x16_t eight = vdupq_n_s8(8);
  first = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(bytes, vdupq_n_u8(0x0f))), eight);
  second = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(bytes, 4)), eight);
}

// Columns a tile: a block of each is decoded once and used by every row; four independent
// double sums per row keep the adds' latency out of the way.
constexpr int64_t kCols = 4;

// y's columns c0 .. c0 + kCols (fewer at the end) for every row; acc: a.m * kCols doubles.
OPFORGE_DOTPROD void tile(const Activations& a, const Weights& w, int64_t c0, double* acc, float* y) {
  const int64_t bytes = quant::block_bytes(w.format), cols = std::min(kCols, w.n - c0);
  const bool q8 = w.format == quant::Format::q8_0;
  std::fill(acc, acc + a.m * kCols, 0.0);
  for (int64_t b = 0; b < a.nb; ++b) {
    int8x16_t first[kCols], second[kCols];
    double dw[kCols];
    for (int64_t j = 0; j < kCols; ++j) {  // a partial tile repeats its last column
      const uint8_t* block = w.data + (c0 + std::min(j, cols - 1)) * w.row_bytes + b * bytes;
      dw[j] = quant::load_scale(block);
      decode(block + 2, q8, first[j], second[j]);
    }
    for (int64_t r = 0; r < a.m; ++r) {
      const int8_t* x = a.q + (r * a.nb + b) * quant::kBlock;
      const int8x16_t x0 = vld1q_s8(x), x1 = vld1q_s8(x + 16);
      const double dx = a.d[r * a.nb + b];
      double* sums = acc + r * kCols;
#pragma GCC unroll 4
      for (int64_t j = 0; j < kCols; ++j) {
        const int32_t s = vaddvq_s32(vdotq_s32(vdotq_s32(vdupq_n_s32(0), first[j], x0), second[j], x1));
        sums[j] += static_cast<double>(s) * (dw[j] * dx);
      }
    }
  }
  for (int64_t r = 0; r < a.m; ++r)
    for (int64_t j = 0; j < cols; ++j) y[r * w.n + c0 + j] = static_cast<float>(acc[r * kCols + j]);
}

}  // namespace

void gemm_arm_dotprod(const Activations& a, const Weights& w, float* y) {
  const int64_t tiles = (w.n + kCols - 1) / kCols;
  parallel_for(tiles, std::max<int64_t>(1, 1024 / (a.m * a.nb + 1)), [&](int64_t begin, int64_t end) {
    std::vector<double> acc(a.m * kCols);
    for (int64_t t = begin; t < end; ++t) tile(a, w, t * kCols, acc.data(), y);
  });
}

}  // namespace opforge::matmul_q
#endif
