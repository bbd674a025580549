// matmul_q's CUDA kernels (launched by matmul_q_cuda.cu; bench/schedules_cuda.cu times one token's
// product in one launch and in two), the CPU kernel's contract (see matmul_q.h) bit for bit:
//   y[r][c] = (float) sum over blocks b, in order, of double(s) * (double(dw) * double(dx)),
// s the exact int32 dot product of block b of weight row c with block b of x's row r quantized
// to Q8_0 (the bytes quantize_q8_0 writes), dw and dx the fp16 scales. Both products are exact
// in double, so the only roundings are the ordered additions, and those are done in the same
// order here: every output has one owner thread that adds its terms block by block.
//
// Two launches on the caller's stream, with a stream-ordered workspace between them (one row of x,
// up to k = 8192: one launch, the gemv quantizing the row itself into shared memory):
//   quantize_x: quantize_q8_0's kernel (a team of lanes per (row, block) of x) writing int8 quants
//               (4 per word), the fp16-rounded scale and the sum of the quants (Q4_0 takes its -8
//               offset out of the dot product).
//   gemv:       for a few rows of x (m <= kGemvRows: decoding a token, a small batch), one warp
//               per weight row (output column), its lanes on 32 consecutive blocks at a time:
//               each lane computes its block's exact terms, then every lane adds the 32 terms in
//               block order through shuffles. All weight rows stream at once; the tiled product
//               the rows kernel replaced, with 128 thread blocks for 4096 columns and a barrier
//               every 16 blocks, reached 6-19% of the H100's copy bandwidth on one activation row.
//   rows:       beyond that, a thread block per 32 rows x 16 columns, a lane per row of x and two
//               weight rows per warp: each lane adds its outputs' terms in block order as it walks
//               the blocks, x's and the weights' quantized blocks staged in shared memory a chunk
//               of 16 blocks at a time, the next chunk loading meanwhile.
// All three read the weights as 16-byte pieces of whole runs of blocks (WeightRuns) where the
// weights' layout allows, and block by block otherwise.
//   mma:        from 64 rows (a prompt), the int32 dot products from int8 tensor cores (exact:
//               mma m16n8k32 is one block's 32 products), the terms and their ordered sums as
//               above: a thread block per 64 rows x 32 columns. (The rows kernel ran 512 rows
//               at 1-2% of the H200's copy bandwidth, 13x torch's float16 product's time.)
// Each kernel has its own header (matmul_q_gemv.cuh, matmul_q_rows.cuh, matmul_q_mma.cuh), the
// pieces they share are in matmul_q_blocks.cuh; this one picks and launches them.
#pragma once

#include "ops/matmul_q/matmul_q_blocks.cuh"
#include "ops/matmul_q/matmul_q_gemv.cuh"
#include "ops/matmul_q/matmul_q_mma.cuh"
#include "ops/matmul_q/matmul_q_rows.cuh"

namespace opforge::matmul_q_cuda {

// A product is one launch (the gemv quantizing x itself) for one row of up to kFusedBlocks blocks
// (k > 0: else the products are empty sums, 0); otherwise x is quantized into a workspace first.
inline bool fuses_row(int64_t m, int64_t nb) { return m == 1 && nb > 0 && nb <= kFusedBlocks; }

// The workspace x's `blocks` quantized blocks take where the product is not fused, and their
// places in it.
inline int64_t quantized_x_bytes(int64_t blocks) { return blocks * (quant::kBlock + 8); }
inline QuantizedX quantized_x_at(void* workspace, int64_t blocks) {
  char* base = static_cast<char*>(workspace);
  float* d = reinterpret_cast<float*>(base + blocks * quant::kBlock);
  return {reinterpret_cast<int32_t*>(base), d, reinterpret_cast<int32_t*>(d + blocks)};
}

// The weights (n rows of nb blocks) at data, rows row_stride bytes apart, bytes inner apart.
inline WeightView weight_view(const uint8_t* data, int64_t row_stride, int64_t inner, quant::Format format,
                              int64_t nb) {
  WeightView wv{data, row_stride, inner, false, false};
  wv.halves = inner == 1 && row_stride % 2 == 0 && reinterpret_cast<uintptr_t>(data) % 2 == 0;
  wv.spans = inner == 1 && row_stride % 16 == 0 && cuda::aligned16(data) && nb * quant::block_bytes(format) % 16 == 0;
  return wv;
}

// y (m x n) = x (m rows of nb blocks, walked by `walk`) times the weights' rows: the quantization
// of x into xq unless `fused`, then the kernel for m rows. The caller checks the launches.
template <typename T>
void launch_product(T* y, const T* x, const cuda::BlockWalk& walk, const WeightView& wv, QuantizedX xq,
                    quant::Format format, int64_t m, int64_t n, int64_t nb, bool fused, cudaStream_t stream) {
  constexpr auto q8 = quant::Format::q8_0, q4 = quant::Format::q4_0;
  const int64_t blocks = m * nb;
  if (blocks > 0 && !fused) cuda::launch_quantize_blocks<q8>(QuantizedXSink{xq}, x, walk, blocks, stream);
  if (m <= kGemvRows) {
    const unsigned gemv_grid = cuda::blocks_for(n * 32, kThreads);
    const RowOfX<T> row{x, walk};
    if (fused && format == q8)
      gemv_kernel<q8, T, 1, true><<<gemv_grid, kThreads, 0, stream>>>(y, xq, row, wv, 1, n, nb);
    else if (fused)
      gemv_kernel<q4, T, 1, true><<<gemv_grid, kThreads, 0, stream>>>(y, xq, row, wv, 1, n, nb);
    else if (m == 1 && format == q8)
      gemv_kernel<q8, T, 1, false><<<gemv_grid, kThreads, 0, stream>>>(y, xq, row, wv, 1, n, nb);
    else if (m == 1)
      gemv_kernel<q4, T, 1, false><<<gemv_grid, kThreads, 0, stream>>>(y, xq, row, wv, 1, n, nb);
    else if (format == q8)
      gemv_kernel<q8, T, kGemvRows, false><<<gemv_grid, kThreads, 0, stream>>>(y, xq, row, wv, int(m), n, nb);
    else
      gemv_kernel<q4, T, kGemvRows, false><<<gemv_grid, kThreads, 0, stream>>>(y, xq, row, wv, int(m), n, nb);
  } else if (m >= kMmaRowsFrom) {
    const dim3 mma_grid(static_cast<unsigned>((n + kMmaTileCols - 1) / kMmaTileCols),
                        cuda::grid_blocks((m + kMmaTileRows - 1) / kMmaTileRows, 65535));
    if (format == q8)
      mma_kernel<q8, T><<<mma_grid, kMmaThreads, 0, stream>>>(y, xq, wv, m, n, nb);
    else
      mma_kernel<q4, T><<<mma_grid, kMmaThreads, 0, stream>>>(y, xq, wv, m, n, nb);
  } else {
    const dim3 grid(static_cast<unsigned>((n + kTileCols - 1) / kTileCols),
                    cuda::grid_blocks((m + kTileRows - 1) / kTileRows, 65535));
    if (format == q8)
      rows_kernel<q8, T><<<grid, kThreads, 0, stream>>>(y, xq, wv, m, n, nb);
    else
      rows_kernel<q4, T><<<grid, kThreads, 0, stream>>>(y, xq, wv, m, n, nb);
  }
}

}  // namespace opforge::matmul_q_cuda
