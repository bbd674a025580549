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
#pragma once

#include "opforge/cuda/async_copy.cuh"
#include "opforge/cuda/ggml_quant.cuh"
#include "opforge/cuda/mma.cuh"

namespace opforge::matmul_q_cuda {

constexpr int kThreads = 256;

// x quantized: per (row, block) g, 8 words of quants, the scale as fp16 value, the quant sum.
struct QuantizedX {
  int32_t* q;
  float* d;
  int32_t* sum;
};

// The quantizer's sink (opforge/cuda/ggml_quant.cuh) for x: a team's quants as words, its block's
// scale rounded to fp16 (the products use the stored scale) and the sum of its quants.
struct QuantizedXSink {
  QuantizedX xq;

  template <int E>
  __device__ __forceinline__ void operator()(int64_t g, int member, bool valid, const int8_t (&q)[E], float d) const {
    int32_t sum = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) sum += q[e];
    sum = cuda::team_sum<quant::kBlock / E>(sum);
    if (!valid) return;
    uint32_t w[E / 4];
    cuda::pack_words(q, w);
#pragma unroll
    for (int i = 0; i < E / 4; ++i) xq.q[g * 8 + member * (E / 4) + i] = static_cast<int32_t>(w[i]);
    if (member == 0) {
      xq.d[g] = cuda::half_value(cuda::half_bits(d));
      xq.sum[g] = sum;
    }
  }
};

// Weight row c's block b starts at w + c * row_stride + b * bytes * inner; byte j is j * inner
// further. `halves`: inner == 1 and every block 2-byte aligned, so quants load as 16-bit words.
// `spans`: inner == 1, the rows 16-byte aligned and a whole number of 16-byte pieces long (a
// multiple of 8 blocks: 272 or 144 bytes), so runs of blocks from a multiple of 8 load as 16-byte
// pieces (WeightRuns).
struct WeightView {
  const uint8_t* data;
  int64_t row_stride, inner;
  bool halves, spans;
};

// Quant bytes j .. j + 3 of a block as one little-endian word.
__device__ __forceinline__ int32_t quant_word(const uint8_t* p, int64_t inner, bool halves) {
  if (halves) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return static_cast<int32_t>(h[0] | (uint32_t(h[1]) << 16));
  }
  return static_cast<int32_t>(p[0] | (uint32_t(p[inner]) << 8) | (uint32_t(p[2 * inner]) << 16) |
                              (uint32_t(p[3 * inner]) << 24));
}

// Quant words in a weight block: 32 int8 values, or 32 nibbles.
template <quant::Format F>
constexpr int kWords = F == quant::Format::q8_0 ? 8 : 4;

// Weight block b of weight row c: its quants as stored (kWords<F> words) into wq, its fp16
// scale returned as a double.
template <quant::Format F>
__device__ __forceinline__ double load_weight_block(const WeightView& w, int64_t c, int64_t b, int32_t* wq) {
  const uint8_t* block = w.data + c * w.row_stride + b * cuda::block_bytes_of(F) * w.inner;
  const uint8_t* qs = block + 2 * w.inner;
#pragma unroll
  for (int i = 0; i < kWords<F>; ++i) wq[i] = quant_word(qs + 4 * i * w.inner, w.inner, w.halves);
  return static_cast<double>(cuda::half_value(static_cast<uint16_t>(block[0] | (block[w.inner] << 8))));
}

// The blocks of a kernel's chunk (or run) of `most` blocks from block b0: fewer at the row's end.
__device__ __forceinline__ int blocks_from(int64_t nb, int64_t b0, int most) {
  return static_cast<int>(nb - b0 < most ? nb - b0 : most);
}

// Runs of kRun consecutive blocks (from a multiple of kRun) of kCols weight rows, copied by a group
// of kGroup threads into shared memory as 16-byte pieces (WeightView::spans), then read a block at
// a time. A thread loading a whole 34-byte (18-byte) block itself, in 16-bit words, made each load
// instruction of a warp touch ~9 (5) cache lines, 18 (11) instructions a block: by that count
// (an estimate, not a measurement) L1, not HBM, set the kernels' pace.
template <quant::Format F, int kRun, int kCols, int kGroup>
struct WeightRuns {
  static constexpr int kBlockBytes = static_cast<int>(cuda::block_bytes_of(F));
  static constexpr int kPieces = kRun * kBlockBytes / 16;  // per row's run
  static constexpr int kAll = kCols * kPieces, kPerThread = (kAll + kGroup - 1) / kGroup;
  static_assert(kRun % 8 == 0, "8 blocks are a whole number of 16-byte pieces in both formats");

  // Piece i of thread t is piece e = t + i * kGroup: row c0 + e / kPieces, piece e % kPieces of its
  // run of kb blocks from block b0 (rows past n and pieces past the run's last block: none).
  __device__ __forceinline__ static bool has(int e, int64_t c0, int64_t n, int kb) {
    return e < kAll && c0 + e / kPieces < n && e % kPieces < (kb * kBlockBytes + 15) / 16;
  }
  // Where piece e is in global memory (16-byte aligned: WeightView::spans, b0 a multiple of kRun).
  __device__ __forceinline__ static const int4* piece(const WeightView& w, int64_t c0, int64_t b0, int e) {
    return reinterpret_cast<const int4*>(w.data + (c0 + e / kPieces) * w.row_stride + b0 * kBlockBytes) +
           e % kPieces;
  }
  __device__ __forceinline__ static void load(int4 (&r)[kPerThread], const WeightView& w, int64_t c0, int64_t n,
                                              int64_t b0, int kb, int t) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = t + i * kGroup;
      if (has(e, c0, n, kb)) r[i] = *piece(w, c0, b0, e);  // the last piece ends within the row: rows end on one
    }
  }
  __device__ __forceinline__ static void store(int4* runs, const int4 (&r)[kPerThread], int64_t c0, int64_t n, int kb,
                                               int t) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
      if (has(t + i * kGroup, c0, n, kb)) runs[t + i * kGroup] = r[i];
  }
  // All of the group's pieces straight to shared memory (cp.async: no registers held for them).
  __device__ __forceinline__ static void copy_async(int4* runs, const WeightView& w, int64_t c0, int64_t n, int64_t b0,
                                                    int kb, int t) {
    for (int e = t; e < kAll; e += kGroup)
      if (has(e, c0, n, kb)) cuda::copy16_async(runs + e, piece(w, c0, b0, e));
  }
  // Block j of row `col`'s staged run: its quants into wq, its scale returned. A block starts at an
  // even byte, so its quant words are the aligned words there shifted by 0 or 16 bits.
  __device__ __forceinline__ static double block(const int4* runs, int col, int j, int32_t* wq) {
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(runs + col * kPieces);
    const int at = j * kBlockBytes, o = at + 2;  // the block, its quants
    const uint32_t* a = reinterpret_cast<const uint32_t*>(bytes) + o / 4;
    const unsigned shift = (o % 4) * 8;
    uint32_t words[kWords<F> + 1];
#pragma unroll
    for (int i = 0; i < kWords<F>; ++i) words[i] = a[i];
    words[kWords<F>] = shift ? a[kWords<F>] : 0u;  // past the block when the shift is 0
#pragma unroll
    for (int i = 0; i < kWords<F>; ++i) wq[i] = static_cast<int32_t>(__funnelshift_r(words[i], words[i + 1], shift));
    return static_cast<double>(cuda::half_value(reinterpret_cast<const uint16_t*>(bytes)[at / 2]));
  }
};

// One exact term: the int32 dot product of a weight block's quants wq with x's quantized block xw
// (8 words; xsum the sum of its quants, for Q4_0's offset), times both scales, in double.
template <quant::Format F>
__device__ __forceinline__ double block_term(const int32_t* wq, const int32_t* xw, int32_t xsum, double dw, double dx) {
  int32_t s = 0;
  if constexpr (F == quant::Format::q8_0) {
#pragma unroll
    for (int i = 0; i < 8; ++i) s = __dp4a(wq[i], xw[i], s);
  } else {  // byte i holds element i (low nibble) and i + 16 (high nibble), stored as value + 8
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s = __dp4a(wq[i] & 0x0f0f0f0f, xw[i], s);
      s = __dp4a((wq[i] >> 4) & 0x0f0f0f0f, xw[4 + i], s);
    }
    s -= 8 * xsum;
  }
  return __dmul_rn(static_cast<double>(s), __dmul_rn(dw, dx));
}

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
template <quant::Format F, typename T, int R, bool kFused>
__global__ void __launch_bounds__(kThreads, R == 1 ? 4 : 3)
    gemv_kernel(T* y, QuantizedX xq, RowOfX<T> row, WeightView w, int rows, int64_t n, int64_t nb) {
  static_assert(!kFused || R == 1, "the fused quantization holds one row");
  using Runs = WeightRuns<F, 32, 1, 32>;  // a warp's 32 blocks of its weight row
  __shared__ __align__(16) int4 runs[kThreads / 32][Runs::kPieces];
  __shared__ __align__(16) int32_t fused_q[kFused ? kFusedBlocks * 8 : 1];
  __shared__ float fused_d[kFused ? kFusedBlocks : 1];
  __shared__ int32_t fused_sum[kFused ? kFusedBlocks : 1];
  int4* run = runs[threadIdx.x / 32];
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
        for (int j = 0; j < count; ++j) acc[r] = __dadd_rn(acc[r], __shfl_sync(cuda::kFullMask, term, j));
      }
    }
    if (lane < rows) {  // lane r stores row r's result (every lane holds all of them)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r == lane) cuda::store(y + r * n + c, __double2float_rn(acc[r]));
    }
  }
}

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
