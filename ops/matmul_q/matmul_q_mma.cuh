// matmul_q's kernel for prompts, on int8 tensor cores (see matmul_q.cuh's overview).
#pragma once

#include "opforge/cuda/mma.cuh"
#include "ops/matmul_q/matmul_q_blocks.cuh"

namespace opforge::matmul_q_cuda {

// For prompts (m >= kMmaRowsFrom): the blocks' int32 dot products from int8 tensor cores (exact),
// the terms and their sums as above. A thread block per 64 rows x 32 columns, 4 warps of 16 rows x
// 32 columns; per chunk of kMmaChunk blocks, x's quants and the weights' (Q4_0's nibbles widened to
// bytes) go to shared memory, and per block each warp runs 4 mma (16 x 8 x 32: one block's k) and
// each thread adds its 16 outputs' terms in block order. Rows are padded by 4 words so that the
// fragments' loads (8 rows or columns x 4 words) hit 32 different banks.
constexpr int kMmaRowsFrom = 64;
constexpr int kMmaWarps = 4, kMmaThreads = 32 * kMmaWarps, kMmaTileRows = 16 * kMmaWarps, kMmaTileCols = 32;
constexpr int kMmaChunk = 8, kMmaStride = kMmaChunk * 8 + 4;

template <quant::Format F, typename T>
__global__ void __launch_bounds__(kMmaThreads, 5)  // 5 tiles per SM: as many as 40 KB of shared memory allows
    mma_kernel(T* y, QuantizedX xq, WeightView w, int64_t m, int64_t n, int64_t nb) {
  __shared__ __align__(16) uint32_t xs[kMmaTileRows][kMmaStride];
  __shared__ __align__(16) uint32_t ws[kMmaTileCols][kMmaStride];
  __shared__ double xd[kMmaTileRows][kMmaChunk];
  __shared__ int32_t xsum[kMmaTileRows][kMmaChunk];
  __shared__ double wd[kMmaTileCols][kMmaChunk];
  using Runs = WeightRuns<F, kMmaChunk, kMmaTileCols, kMmaThreads>;  // the tile's weight rows' chunk
  __shared__ __align__(16) int4 runs[Runs::kAll];
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rows = (threadIdx.x / 32) * 16;  // this warp's rows in the tile
  const int64_t c0 = int64_t(blockIdx.x) * kMmaTileCols;
  for (int64_t r0 = int64_t(blockIdx.y) * kMmaTileRows; r0 < m; r0 += int64_t(gridDim.y) * kMmaTileRows) {
    double acc[4][4] = {};  // [column tile][mma result register]
    for (int64_t b0 = 0; b0 < nb; b0 += kMmaChunk) {
      const int kb = blocks_from(nb, b0, kMmaChunk);
      __syncthreads();  // the previous chunk's reads of shared memory are done
      if (w.spans) Runs::copy_async(runs, w, c0, n, b0, kb, threadIdx.x);  // in flight while x's chunk loads
      for (int e = threadIdx.x; e < kMmaTileRows * kMmaChunk * 8; e += kMmaThreads) {
        const int row = e / (kMmaChunk * 8), word = e % (kMmaChunk * 8);
        const bool in = r0 + row < m && word / 8 < kb;
        xs[row][word] = in ? static_cast<uint32_t>(xq.q[((r0 + row) * nb + b0) * 8 + word]) : 0u;
      }
      for (int e = threadIdx.x; e < kMmaTileRows * kMmaChunk; e += kMmaThreads) {
        const int row = e / kMmaChunk, b = e % kMmaChunk;
        const bool in = r0 + row < m && b < kb;
        xd[row][b] = in ? static_cast<double>(xq.d[(r0 + row) * nb + b0 + b]) : 0.0;
        xsum[row][b] = in ? xq.sum[(r0 + row) * nb + b0 + b] : 0;
      }
      if (w.spans) {  // the same for every thread
        cuda::wait_async_copies();
        __syncthreads();  // the weight runs are in shared memory
      }
      for (int e = threadIdx.x; e < kMmaTileCols * kMmaChunk; e += kMmaThreads) {
        const int col = e / kMmaChunk, b = e % kMmaChunk;
        int32_t wq[kWords<F>] = {};
        const bool in = c0 + col < n && b < kb;
        wd[col][b] = !in      ? 0.0
                     : w.spans ? Runs::block(runs, col, b, wq)
                               : load_weight_block<F>(w, c0 + col, b0 + b, wq);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          uint32_t v = static_cast<uint32_t>(wq[i % kWords<F>]);
          if constexpr (F == quant::Format::q4_0) v = (i < 4 ? v : v >> 4) & 0x0f0f0f0fu;  // stored as value + 8
          ws[col][b * 8 + i] = v;
        }
      }
      __syncthreads();
      for (int b = 0; b < kb; ++b) {
        uint32_t a[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = xs[rows + g + 8 * (r & 1)][b * 8 + t + 4 * (r >> 1)];
        int32_t d[4][4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t bq[2] = {ws[8 * j + g][b * 8 + t], ws[8 * j + g][b * 8 + t + 4]};
          cuda::mma_s8_16x8x32(d[j], a, bq);
        }
        const double dx[2] = {xd[rows + g][b], xd[rows + g + 8][b]};
        const int32_t offset[2] = {F == quant::Format::q4_0 ? 8 * xsum[rows + g][b] : 0,
                                   F == quant::Format::q4_0 ? 8 * xsum[rows + g + 8][b] : 0};
        // acc + s * (dw * dx) as one FMA: both products are exact in double (dw and dx are fp16
        // values, 11 significant bits each; |s| < 2^20), so the FMA's one rounding is the addition's
        // and the bits are block_term's then __dadd_rn's, with one double operation fewer (this
        // loop, not the tensor cores, is the kernel's arithmetic).
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const double s = static_cast<double>(d[j][r] - offset[r >> 1]);
            acc[j][r] = __fma_rn(s, __dmul_rn(wd[8 * j + 2 * t + (r & 1)][b], dx[r >> 1]), acc[j][r]);
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int64_t row = r0 + rows + g + 8 * (r >> 1), col = c0 + 8 * j + 2 * t + (r & 1);
        if (row < m && col < n) cuda::store(y + row * n + col, __double2float_rn(acc[j][r]));
      }
    }
  }
}

}  // namespace opforge::matmul_q_cuda
