// matmul_q on CUDA, the CPU kernel's contract (see matmul_q.h) bit for bit:
//   y[r][c] = (float) sum over blocks b, in order, of double(s) * (double(dw) * double(dx)),
// s the exact int32 dot product of block b of weight row c with block b of x's row r quantized
// to Q8_0 (the bytes quantize_q8_0 writes), dw and dx the fp16 scales. Both products are exact
// in double, so the only roundings are the ordered additions, and those are done in the same
// order here: every output has one owner thread that adds its terms block by block.
//
// Two launches on the caller's stream, with a stream-ordered workspace between them:
//   quantize_x: one warp per (row, block) of x: int8 quants (4 per word), the fp16-rounded scale
//               and the sum of the quants (Q4_0 takes its -8 offset out of the dot product).
//   gemv:       for a few rows of x (m <= kGemvRows: decoding a token, a small batch), one warp
//               per weight row (output column), its lanes on 32 consecutive blocks at a time:
//               each lane computes its block's exact terms, then every lane adds the 32 terms in
//               block order through shuffles. All weight rows stream at once; the tiled product
//               below, with 128 thread blocks for 4096 columns and a barrier every 16 blocks,
//               reached 6-19% of the H100's copy bandwidth on one activation row.
//   product:    a thread block per 8 rows x 32 columns (one output per thread). Per chunk of 16
//               blocks, all threads compute the exact terms of every (row, column, block) from
//               the weights as stored (dequantized on the fly: nibbles or int8 straight into
//               __dp4a), into shared memory; then each thread adds its output's 16 terms in order.
//               Splitting the dot products from the ordered sum keeps all 256 threads busy even
//               for one activation row, where a thread per output would leave the GPU idle.
#include "opforge/cuda/ggml_quant.cuh"
#include "opforge/cuda/scratch.h"
#include "opforge/registry.h"

namespace opforge::matmul_q_cuda {

constexpr int kThreads = 256;
constexpr int kRows = 8, kCols = 32, kChunk = 16;  // kRows * kCols == kThreads: one output each
static_assert(kRows * kCols == kThreads);

// x quantized: per (row, block) g, 8 words of quants, the scale as fp16 value, the quant sum.
struct QuantizedX {
  int32_t* q;
  float* d;
  int32_t* sum;
};

template <typename T>
__global__ void quantize_x_kernel(QuantizedX xq, const T* x, cuda::BlockWalk walk, int64_t blocks) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t g = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; g < blocks; g += warps) {
    const float v = static_cast<float>(cuda::load(x + walk.offset(g) + lane * walk.inner));
    int8_t q;
    const float d = cuda::quantize_lane_q8_0(v, q);
    reinterpret_cast<int8_t*>(xq.q)[g * quant::kBlock + lane] = q;
    const int32_t sum = cuda::warp_sum(q);
    if (lane == 0) {
      xq.d[g] = cuda::half_value(cuda::half_bits(d));  // the products use the stored (fp16) scale
      xq.sum[g] = sum;
    }
  }
}

// Weight row c's block b starts at w + c * row_stride + b * bytes * inner; byte j is j * inner
// further. `halves`: inner == 1 and every block 2-byte aligned, so quants load as 16-bit words.
struct WeightView {
  const uint8_t* data;
  int64_t row_stride, inner;
  bool halves;
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

template <quant::Format F, typename T>
__global__ void __launch_bounds__(kThreads)
    product_kernel(T* y, QuantizedX xq, WeightView w, int64_t m, int64_t n, int64_t nb) {
  __shared__ int32_t xs[kRows][kChunk][9];  // 8 quant words, padded so neighbouring blocks sit in other banks
  __shared__ double xd[kRows][kChunk];
  __shared__ int32_t xsum[kRows][kChunk];
  __shared__ double terms[kRows][kCols][kChunk + 1];
  const int tid = threadIdx.x;
  const int own_r = tid / kCols, own_c = tid % kCols;  // the output this thread sums
  const int64_t c0 = int64_t(blockIdx.x) * kCols;
  // Row tiles in a grid-stride loop: gridDim.y is capped at 65535.
  for (int64_t r0 = int64_t(blockIdx.y) * kRows; r0 < m; r0 += int64_t(gridDim.y) * kRows) {
    const int rows = static_cast<int>(m - r0 < kRows ? m - r0 : kRows);
    double acc = 0.0;
    for (int64_t b0 = 0; b0 < nb; b0 += kChunk) {
      const int kb = static_cast<int>(nb - b0 < kChunk ? nb - b0 : kChunk);
      for (int e = tid; e < kRows * kChunk * 8; e += kThreads) {
        const int r = e / (kChunk * 8), b = (e / 8) % kChunk, word = e % 8;
        if (r < rows && b < kb) xs[r][b][word] = xq.q[((r0 + r) * nb + b0 + b) * 8 + word];
      }
      for (int e = tid; e < kRows * kChunk; e += kThreads) {
        const int r = e / kChunk, b = e % kChunk;
        if (r < rows && b < kb) {
          xd[r][b] = static_cast<double>(xq.d[(r0 + r) * nb + b0 + b]);
          xsum[r][b] = xq.sum[(r0 + r) * nb + b0 + b];
        }
      }
      __syncthreads();
      // Neighbouring threads take neighbouring blocks of one weight row: the reads coalesce.
      for (int p = tid; p < kCols * kChunk; p += kThreads) {
        const int c = p / kChunk, b = p % kChunk;
        if (c0 + c >= n || b >= kb) continue;
        int32_t wq[kWords<F>];
        const double dw = load_weight_block<F>(w, c0 + c, b0 + b, wq);
        for (int r = 0; r < rows; ++r) terms[r][c][b] = block_term<F>(wq, xs[r][b], xsum[r][b], dw, xd[r][b]);
      }
      __syncthreads();
      if (own_r < rows && c0 + own_c < n)
        for (int b = 0; b < kb; ++b) acc = __dadd_rn(acc, terms[own_r][own_c][b]);
      __syncthreads();  // xs and terms are rewritten by the next chunk
    }
    if (own_r < rows && c0 + own_c < n)
      cuda::store(y + (r0 + own_r) * n + c0 + own_c, __double2float_rn(acc));  // to T: round to nearest even
  }
}

constexpr int kGemvRows = 8;

template <quant::Format F, typename T>
__global__ void __launch_bounds__(kThreads)
    gemv_kernel(T* y, QuantizedX xq, WeightView w, int rows, int64_t n, int64_t nb) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  for (int64_t c = (blockIdx.x * int64_t(kThreads) + threadIdx.x) / 32; c < n; c += warps) {  // warp-uniform
    double acc[kGemvRows];
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) acc[r] = 0.0;
    for (int64_t b0 = 0; b0 < nb; b0 += 32) {
      const int64_t b = b0 + lane;
      const int count = static_cast<int>(nb - b0 < 32 ? nb - b0 : 32);
      int32_t wq[kWords<F>] = {};
      const double dw = lane < count ? load_weight_block<F>(w, c, b, wq) : 0.0;
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        if (r >= rows) break;
        const int64_t g = r * nb + b;  // x's row r, block b
        const double term =
            lane < count ? block_term<F>(wq, xq.q + g * 8, xq.sum[g], dw, static_cast<double>(xq.d[g])) : 0.0;
        for (int j = 0; j < count; ++j) acc[r] = __dadd_rn(acc[r], __shfl_sync(cuda::kFullMask, term, j));
      }
    }
    if (lane < rows) {  // lane r stores row r's result (every lane holds all of them)
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r)
        if (r == lane) cuda::store(y + r * n + c, __double2float_rn(acc[r]));
    }
  }
}

void run(const KernelCall& call) {
  const char* op = "matmul_q";
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("w");
  const TensorView& out = call.output();
  const quant::Format format = quant::format_of(call);
  const int64_t k = x.size(-1), nb = k / quant::kBlock, n = w.size(0);
  const int64_t m = out.numel() / n;  // out is not empty: run_kernel skips empty results
  const int64_t blocks = m * nb;
  cudaStream_t stream = cuda::stream_of(call);
  QuantizedX xq{nullptr, nullptr, nullptr};
  const cuda::BlockWalk walk = cuda::block_walk(op, x);
  // The quantized activations (none for k == 0: the products are empty sums, 0).
  const cuda::Scratch workspace(call, blocks * (quant::kBlock + 8));
  if (blocks > 0) {
    xq.q = workspace.as<int32_t>();
    xq.d = reinterpret_cast<float*>(workspace.as<char>() + blocks * quant::kBlock);
    xq.sum = reinterpret_cast<int32_t*>(xq.d + blocks);
  }
  WeightView wv{w.data_as<const uint8_t>(), w.stride(0), w.stride(1), false};
  wv.halves = wv.inner == 1 && wv.row_stride % 2 == 0 && reinterpret_cast<uintptr_t>(wv.data) % 2 == 0;
  const int64_t row_tiles = (m + kRows - 1) / kRows;
  const dim3 grid(static_cast<unsigned>((n + kCols - 1) / kCols), cuda::grid_blocks(row_tiles, 65535));
  const auto launch = [&](auto tag) {
    using T = decltype(tag);
    if (blocks > 0) {
      quantize_x_kernel<T><<<cuda::blocks_for(blocks * 32, kThreads), kThreads, 0, stream>>>(
          xq, x.data_as<const T>(), walk, blocks);
      cuda::check_launch(op);
    }
    if (m <= kGemvRows) {
      const unsigned gemv_grid = cuda::blocks_for(n * 32, kThreads);
      if (format == quant::Format::q8_0)
        gemv_kernel<quant::Format::q8_0, T><<<gemv_grid, kThreads, 0, stream>>>(out.data_as<T>(), xq, wv, int(m), n, nb);
      else
        gemv_kernel<quant::Format::q4_0, T><<<gemv_grid, kThreads, 0, stream>>>(out.data_as<T>(), xq, wv, int(m), n, nb);
    } else if (format == quant::Format::q8_0) {
      product_kernel<quant::Format::q8_0, T><<<grid, kThreads, 0, stream>>>(out.data_as<T>(), xq, wv, m, n, nb);
    } else {
      product_kernel<quant::Format::q4_0, T><<<grid, kThreads, 0, stream>>>(out.data_as<T>(), xq, wv, m, n, nb);
    }
    cuda::check_launch(op);
  };
  switch (x.dtype) {
    case DType::float32: launch(float{}); break;
    case DType::float16: launch(__half{}); break;
    case DType::bfloat16: launch(__nv_bfloat16{}); break;
    default: fail(ErrorKind::not_implemented, op, "(): cuda kernel has no ", dtype_name(x.dtype), " variant");
  }
}

OPFORGE_KERNEL(matmul_q, "cuda", (std::vector<DType>{DType::float32, DType::float16, DType::bfloat16}), run);

}  // namespace opforge::matmul_q_cuda
