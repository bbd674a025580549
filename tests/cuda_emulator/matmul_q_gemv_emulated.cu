// matmul_q's gemv (ops/matmul_q/matmul_q_gemv.cuh) with a run's terms summed by every lane through
// shuffles (the op's) and by one lane per row from shared memory (kLaneSums, which
// bench/schedules_cuda.cu times): both against the contract computed here on the host (exact
// block sums, terms in double, added in block order), for one row and for three in the 8-row
// instantiation; weight rows of several runs of 32 blocks and a partial last one, staged as
// 16-byte pieces (72 blocks) and read block by block (70), columns not a multiple of a block's
// 8 warps. The outputs are float32: a term dropped or counted twice shows, the order of the
// double additions rarely does (their rounding is far below float32's). Compiled like the ops'
// CUDA sources: rewritten, then with the emulator's header ahead.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "opforge/half.h"
#include "ops/matmul_q/matmul_q.cuh"

namespace {

using namespace opforge;
namespace mq = matmul_q_cuda;

struct Case {
  int64_t n, nb;
  int rows;
};

// Random weights (any byte; scales fp16 of 1e-3 to 1e-1) and x already quantized (any int8 quant,
// fp16-valued scales), the product by the contract, and both kernels' outputs.
template <quant::Format F, int R>
void check_case(const Case& c, unsigned seed) {
  const int64_t bytes = quant::block_bytes(F), row_bytes = c.nb * bytes;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> scale(1e-3f, 1e-1f);
  std::vector<int4> storage((c.n * row_bytes + 15) / 16);  // 16-byte aligned, as WeightView::spans asks
  uint8_t* w = reinterpret_cast<uint8_t*>(storage.data());
  for (int64_t i = 0; i < c.n * row_bytes; ++i) w[i] = static_cast<uint8_t>(gen());
  for (int64_t blk = 0; blk < c.n * c.nb; ++blk) {
    const float16 d = to_float16(scale(gen));
    std::memcpy(w + blk * bytes, &d.bits, 2);
  }
  const int64_t xblocks = c.rows * c.nb;
  std::vector<int32_t> q(xblocks * 8), sum(xblocks);
  std::vector<float> d(xblocks);
  for (int64_t g = 0; g < xblocks; ++g) {
    int8_t v[32];
    int32_t s = 0;
    for (int8_t& e : v) s += (e = static_cast<int8_t>(gen() % 255 - 127));
    std::memcpy(&q[g * 8], v, 32);
    sum[g] = s;
    d[g] = to_float(to_float16(scale(gen)));
  }
  std::vector<float> want(c.rows * c.n);
  for (int r = 0; r < c.rows; ++r)
    for (int64_t col = 0; col < c.n; ++col) {
      double acc = 0.0;
      for (int64_t b = 0; b < c.nb; ++b) {
        const uint8_t* blk = w + col * row_bytes + b * bytes;
        const int8_t* xv = reinterpret_cast<const int8_t*>(&q[(r * c.nb + b) * 8]);
        int64_t s = 0;
        for (int j = 0; j < 32; ++j) {
          const int wv = F == quant::Format::q8_0 ? static_cast<int8_t>(blk[2 + j])
                                                  : ((blk[2 + j % 16] >> (j < 16 ? 0 : 4)) & 0x0f) - 8;
          s += int64_t{wv} * xv[j];
        }
        float16 dw;
        std::memcpy(&dw.bits, blk, 2);
        acc += static_cast<double>(s) * (static_cast<double>(to_float(dw)) * static_cast<double>(d[r * c.nb + b]));
      }
      want[r * c.n + col] = static_cast<float>(acc);
    }
  const mq::WeightView wv = mq::weight_view(w, row_bytes, 1, F, c.nb);
  ASSERT_EQ(wv.spans, c.nb % 8 == 0) << "the case meant to test " << (c.nb % 8 ? "block loads" : "16-byte runs");
  const mq::QuantizedX xq{q.data(), d.data(), sum.data()};
  const unsigned grid = cuda::blocks_for(c.n * 32, mq::kThreads);
  const mq::RowOfX<float> unused{};  // x's float row: only the fused gemv reads it
  for (const bool lane_sums : {false, true}) {
    std::vector<float> y(c.rows * c.n, -1.0f);
    if (lane_sums)
      mq::gemv_kernel<F, float, R, false, true><<<grid, mq::kThreads, 0, nullptr>>>(y.data(), xq, unused, wv, c.rows, c.n, c.nb);
    else
      mq::gemv_kernel<F, float, R, false, false><<<grid, mq::kThreads, 0, nullptr>>>(y.data(), xq, unused, wv, c.rows, c.n, c.nb);
    for (int64_t i = 0; i < c.rows * c.n; ++i)
      ASSERT_EQ(y[i], want[i]) << quant::format_name(F) << (lane_sums ? " lane sums" : " shuffled sums") << ", output "
                               << i << " of " << c.rows << " x " << c.n << ", " << c.nb << " blocks";
  }
}

TEST(MatmulQGemv, LaneSumsAndShuffledSumsKeepTheContract) {
  for (const int64_t nb : {int64_t{72}, int64_t{70}}) {
    check_case<quant::Format::q4_0, 1>({37, nb, 1}, 1);
    check_case<quant::Format::q8_0, 1>({37, nb, 1}, 2);
    check_case<quant::Format::q4_0, mq::kGemvRows>({21, nb, 3}, 3);
    check_case<quant::Format::q8_0, mq::kGemvRows>({21, nb, 3}, 4);
  }
}

}  // namespace
