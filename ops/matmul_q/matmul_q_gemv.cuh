// matmul_q's kernel for a few rows: a token's product, a small batch (see matmul_q.cuh's overview).
#pragma once

#include "ops/matmul_q/matmul_q_blocks.cuh"

namespace opforge::matmul_q_cuda {

constexpr int kGemvRows = 8;

// One row of x quantized inside the gemv, for rows of at most kFusedBlocks blocks (k <= 8192): a
// token's product is then one launch and no workspace. Every thread block quantizes the row for
// itself (k values read from L2; 128 blocks of 32 at k = 4096 for its 256 threads), its warps' first
// weight runs already loading.
constexpr int kFusedBlocks = 256;

// The row of x a fused gemv quantizes (as quantize_blocks reads x).
template <typename T>
struct RowOfX {
  const T* x;
  cuda::BlockWalk walk;
};

// R: the most rows a launch has (1: one token, its own instantiation in fewer registers); kFused:
// R == 1 and x quantized here (xq then points to shared memory). One row runs 4 blocks per SM (64
// registers, no spills): 4096 columns (warps) in one wave on 132 SMs; more rows need more registers
// (3 blocks, 85 at most).
// kLaneSums: how a run's 32 terms (one a lane) are added in block order. false (the op's): every
// lane adds all 32, each fetched by a shuffle, so the whole warp waits on 32 shuffles and adds a
// run, 32 times the arithmetic. true (bench/schedules_cuda.cu times it, untimed as yet): the
// lanes write their terms to shared memory and lane r alone adds row r's, in the same order, so
// the rows' sums run side by side and the other lanes go on. Same bits either way.
template <quant::Format F, typename T, int R, bool kFused, bool kLaneSums = false>
__global__ void __launch_bounds__(kThreads, R == 1 ? 4 : 3)
    gemv_kernel(T* y, QuantizedX xq, RowOfX<T> row, WeightView w, int rows, int64_t n, int64_t nb) {
  static_assert(!kFused || R == 1, "the fused quantization holds one row");
  using Runs = WeightRuns<F, 32, 1, 32>;  // a warp's 32 blocks of its weight row
  __shared__ __align__(16) int4 runs[kThreads / 32][Runs::kPieces];
  __shared__ __align__(16) int32_t fused_q[kFused ? kFusedBlocks * 8 : 1];
  __shared__ float fused_d[kFused ? kFusedBlocks : 1];
  __shared__ int32_t fused_sum[kFused ? kFusedBlocks : 1];
  __shared__ double lane_terms[kLaneSums ? kThreads / 32 : 1][R][33];  // 33: row r + 1 two banks on
  int4* run = runs[threadIdx.x / 32];
  auto& terms = lane_terms[kLaneSums ? threadIdx.x / 32 : 0];
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  const int64_t first = (blockIdx.x * int64_t(kThreads) + threadIdx.x) / 32;  // this warp's first column
  int4 next[Runs::kPerThread];  // the next run's pieces, loading while the current one computes
  bool loaded = false;          // next holds the first run of this warp's first column
  if constexpr (kFused) {
    if (w.spans && first < n) {
      Runs::load(next, w, first, n, 0, blocks_from(nb, 0, 32), lane);
      loaded = true;
    }
    xq = QuantizedX{fused_q, fused_d, fused_sum};
    // One block a team at a time: with the weights' first run held in registers, more in flight
    // spilled (2 or 4 blocks: 30-230 bytes); the first run is what keeps HBM busy meanwhile.
    cuda::quantize_by_teams<quant::Format::q8_0, 1>(QuantizedXSink{xq}, row.x, row.walk, row.walk.packed, nb,
                                                    threadIdx.x, kThreads);
    __syncthreads();  // the whole row is in shared memory
  }
  for (int64_t c = first; c < n; c += warps) {  // warp-uniform
    double acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0;
    double mine = 0.0;  // kLaneSums: row `lane`'s sum
    if (w.spans && !loaded) Runs::load(next, w, c, n, 0, blocks_from(nb, 0, 32), lane);
    loaded = false;
    for (int64_t b0 = 0; b0 < nb; b0 += 32) {
      const int64_t b = b0 + lane;
      const int count = blocks_from(nb, b0, 32);
      int32_t wq[kWords<F>] = {};
      double dw = 0.0;
      if (w.spans) {
        Runs::store(run, next, c, n, count, lane);
        __syncwarp();
        if (b0 + 32 < nb) Runs::load(next, w, c, n, b0 + 32, blocks_from(nb, b0 + 32, 32), lane);
        if (lane < count) dw = Runs::block(run, 0, lane, wq);
        __syncwarp();  // every lane has its block before the next run is stored
      } else if (lane < count) {
        dw = load_weight_block<F>(w, c, b, wq);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        const int64_t g = r * nb + b;  // x's row r, block b
        const double term =
            lane < count ? block_term<F>(wq, xq.q + g * 8, xq.sum[g], dw, static_cast<double>(xq.d[g])) : 0.0;
        if constexpr (kLaneSums)
          terms[r][lane] = term;
        else
          for (int j = 0; j < count; ++j) acc[r] = __dadd_rn(acc[r], __shfl_sync(cuda::kFullMask, term, j));
      }
      if constexpr (kLaneSums) {
        __syncwarp();  // the run's terms are in
        if (lane < rows) {
#pragma unroll 8
          for (int j = 0; j < count; ++j) mine = __dadd_rn(mine, terms[lane][j]);
        }
        __syncwarp();  // read before the next run's terms overwrite them
      }
    }
    if (lane < rows) {  // lane r stores row r's result
      if constexpr (kLaneSums) {
        cuda::store(y + lane * n + c, __double2float_rn(mine));
      } else {
#pragma unroll
        for (int r = 0; r < R; ++r)  // every lane holds all of them
          if (r == lane) cuda::store(y + r * n + c, __double2float_rn(acc[r]));
      }
    }
  }
}

}  // namespace opforge::matmul_q_cuda
