// matmul_q's kernel for a batch of rows (see matmul_q.cuh's overview).
#pragma once

#include "ops/matmul_q/matmul_q_blocks.cuh"

namespace opforge::matmul_q_cuda {

// rows_kernel's tile: 32 rows of x (a lane each) by 16 weight rows (2 per warp), 16 blocks at a time.
constexpr int kTileRows = 32, kWarpCols = 2, kTileCols = kWarpCols * (kThreads / 32), kTileChunk = 16;
static_assert(kWarpCols * kTileChunk == 32, "each lane loads one of its warp's weight blocks per chunk");
// x's quant words in shared memory: a row's 16 blocks, then 4 words of padding, so that the 16-byte
// loads of one block by 8 consecutive lanes (rows) fall in 8 different groups of banks.
constexpr int kXStride = kTileChunk * 8 + 4;

// A warp's weight runs in rows_kernel: its 2 weight rows' 16 blocks of a chunk.
template <quant::Format F>
using TileRuns = WeightRuns<F, kTileChunk, kWarpCols, 32>;

// One chunk's share of a thread: x's quant words, scales and sums for the tile's rows (a part of
// each, every thread the same number) and its lane's part of the warp's weight blocks (16-byte
// pieces of them, or where the weights do not allow those, one whole block), in registers: loaded
// one chunk ahead, while the tile computes the current one, then stored to shared memory.
template <quant::Format F>
struct ChunkShare {
  static constexpr int kWordsPerThread = kTileRows * kTileChunk * 8 / kThreads;
  static constexpr int kScalesPerThread = kTileRows * kTileChunk / kThreads;
  int32_t xw[kWordsPerThread];
  float xd[kScalesPerThread];
  int32_t xsum[kScalesPerThread];
  int4 pieces[TileRuns<F>::kPerThread];
  int32_t wq[kWords<F>];
  double dw;

  // Chunk b0 (kb blocks) of rows r0.. and of this warp's weight rows c0, c0 + 1. Thread t takes
  // word t % 8 of block (t / 8) % 16 in rows t / 128, + 2, + 4, ..., and the scale and sum of block
  // t % 16 in rows t / 16, + 16.
  __device__ void load(const QuantizedX& xq, const WeightView& w, int64_t r0, int64_t m, int64_t c0, int64_t n,
                       int64_t nb, int64_t b0, int kb) {
    constexpr int kWordRowStep = kThreads / (kTileChunk * 8), kScaleRowStep = kThreads / kTileChunk;
    {
      const int b = (threadIdx.x / 8) % kTileChunk, row = threadIdx.x / (kTileChunk * 8);
      const int32_t* p = xq.q + ((r0 + row) * nb + b0 + b) * 8 + threadIdx.x % 8;
      const int64_t step = kWordRowStep * nb * 8;
#pragma unroll
      for (int i = 0; i < kWordsPerThread; ++i)
        xw[i] = r0 + row + i * kWordRowStep < m && b < kb ? p[i * step] : 0;
    }
    {
      const int b = threadIdx.x % kTileChunk, row = threadIdx.x / kTileChunk;
      const int64_t g = (r0 + row) * nb + b0 + b, step = kScaleRowStep * nb;
#pragma unroll
      for (int i = 0; i < kScalesPerThread; ++i) {
        const bool in = r0 + row + i * kScaleRowStep < m && b < kb;
        xd[i] = in ? xq.d[g + i * step] : 0.f;
        xsum[i] = in ? xq.sum[g + i * step] : 0;
      }
    }
    const int lane = threadIdx.x % 32, col = lane / kTileChunk, b = lane % kTileChunk;
    if (w.spans) {
      TileRuns<F>::load(pieces, w, c0, n, b0, kb, lane);
      return;
    }
#pragma unroll
    for (int i = 0; i < kWords<F>; ++i) wq[i] = 0;
    dw = c0 + col < n && b < kb ? load_weight_block<F>(w, c0 + col, b0 + b, wq) : 0.0;
  }
};

// For a batch (kGemvRows < m < kMmaRowsFrom, below the tensor-core kernel's tiles): a thread block
// per 32 rows x 16 columns, each lane one row of x, each warp two weight rows. Every output
// belongs to one lane, which adds its terms in block order as it walks the blocks: no barrier or
// shuffle between a term and its sum. Per chunk of 16 blocks, x's quantized blocks for the tile's
// rows and each warp's weight blocks go to shared memory (a weight block is read by every lane at
// once: a broadcast), the next chunk loading into registers meanwhile. The tiled kernel it
// replaced (8 rows x 32 columns, terms through shared memory, three barriers a chunk) reached 6-9%
// of the H100's copy bandwidth at m = 32; this one 6-11% of the H200's (1.1x torch's float32
// product on dequantized weights).
template <quant::Format F, typename T>
__global__ void __launch_bounds__(kThreads, 2)  // two tiles per SM: one loads while the other computes
    rows_kernel(T* y, QuantizedX xq, WeightView w, int64_t m, int64_t n, int64_t nb) {
  __shared__ __align__(16) int32_t xs[kTileRows * kXStride];
  __shared__ double xd[kTileRows][kTileChunk + 1];
  __shared__ int32_t xsum[kTileRows][kTileChunk + 1];
  __shared__ __align__(16) int32_t ws[kThreads / 32][kWarpCols][kTileChunk][8];
  __shared__ double wd[kThreads / 32][kWarpCols][kTileChunk];
  __shared__ __align__(16) int4 runs[kThreads / 32][TileRuns<F>::kAll];
  using Share = ChunkShare<F>;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t c0 = int64_t(blockIdx.x) * kTileCols + warp * kWarpCols;
  // Row tiles in a grid-stride loop: gridDim.y is capped at 65535.
  for (int64_t r0 = int64_t(blockIdx.y) * kTileRows; r0 < m; r0 += int64_t(gridDim.y) * kTileRows) {
    double acc[kWarpCols] = {};
    Share next;
    next.load(xq, w, r0, m, c0, n, nb, 0, blocks_from(nb, 0, kTileChunk));
    for (int64_t b0 = 0; b0 < nb; b0 += kTileChunk) {
      const int kb = blocks_from(nb, b0, kTileChunk);
      __syncthreads();  // the previous chunk's reads of shared memory are done
#pragma unroll
      for (int i = 0; i < Share::kWordsPerThread; ++i) {
        const int e = threadIdx.x + i * kThreads;
        xs[(e / (kTileChunk * 8)) * kXStride + e % (kTileChunk * 8)] = next.xw[i];
      }
#pragma unroll
      for (int i = 0; i < Share::kScalesPerThread; ++i) {
        const int e = threadIdx.x + i * kThreads;
        xd[e / kTileChunk][e % kTileChunk] = static_cast<double>(next.xd[i]);
        xsum[e / kTileChunk][e % kTileChunk] = next.xsum[i];
      }
      if (w.spans) {  // the warp's pieces to shared memory, then each lane's block from there
        TileRuns<F>::store(runs[warp], next.pieces, c0, n, kb, lane);
        __syncwarp();
        const int col = lane / kTileChunk, b = lane % kTileChunk;
#pragma unroll
        for (int i = 0; i < kWords<F>; ++i) next.wq[i] = 0;
        next.dw = c0 + col < n && b < kb ? TileRuns<F>::block(runs[warp], col, b, next.wq) : 0.0;
      }
#pragma unroll
      for (int i = 0; i < kWords<F>; ++i) ws[warp][lane / kTileChunk][lane % kTileChunk][i] = next.wq[i];
      wd[warp][lane / kTileChunk][lane % kTileChunk] = next.dw;
      __syncthreads();
      if (b0 + kTileChunk < nb) {
        const int64_t b1 = b0 + kTileChunk;
        next.load(xq, w, r0, m, c0, n, nb, b1, blocks_from(nb, b1, kTileChunk));
      }
      for (int b = 0; b < kb; ++b) {
        const int4* xp = reinterpret_cast<const int4*>(xs + lane * kXStride + b * 8);
        const int4 lo = xp[0], hi = xp[1];
        const int32_t xw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        const double dx = xd[lane][b];
        const int32_t sum = xsum[lane][b];
#pragma unroll
        for (int col = 0; col < kWarpCols; ++col) {
          const int4* wp = reinterpret_cast<const int4*>(ws[warp][col][b]);
          int32_t wq[8];
#pragma unroll
          for (int h = 0; h < kWords<F> / 4; ++h) {  // Q4_0's nibbles: 4 words
            const int4 v = wp[h];
            wq[4 * h] = v.x, wq[4 * h + 1] = v.y, wq[4 * h + 2] = v.z, wq[4 * h + 3] = v.w;
          }
          acc[col] = __dadd_rn(acc[col], block_term<F>(wq, xw, sum, wd[warp][col][b], dx));
        }
      }
    }
    const int64_t r = r0 + lane;
#pragma unroll
    for (int col = 0; col < kWarpCols; ++col)
      if (r < m && c0 + col < n) cuda::store(y + r * n + c0 + col, __double2float_rn(acc[col]));  // round to nearest even
  }
}

}  // namespace opforge::matmul_q_cuda
