// rms_norm_backward on CUDA, on the caller's stream. Contiguous aligned rows (cuda/rows.cuh's
// CachedRow) in two launches:
//   fused:   one block per fixed chunk of rows; each row of grad and x read once into registers:
//            block sums of x^2 and g*w*x, grad_x stored, and g*x*inv added to the block's
//            column sums (registers, like the weight's packs) for grad_weight
//   combine: thread per column; adds the chunks' sums in chunk order
// Other layouts in three:
//   rows:    one block per row; block sums of x^2 and g*w*x, then grad_x, and inv kept
//   partial: thread per column per fixed chunk of rows; sums g*x*inv down the chunk
//   combine: as above
// The fused path reads grad and x once where the three-launch one reads them three times.
// The path, the chunk count and every summation order depend on the shape and the layout only
// (not on the device or the run): grad_weight is bitwise repeatable. inv and the partials live
// in a stream-ordered workspace.
#include <cmath>

#include "opforge/cuda/rows.cuh"
#include "opforge/cuda/scratch.h"
#include "opforge/registry.h"

namespace opforge::rms_norm_backward_cuda {

constexpr int kThreads = 256;
constexpr int64_t kMaxChunks = 64;
// Threads per block of the fused kernel, at most: its column sums and the weight's packs live in
// registers beside the two rows, which for the half types (8 elements a pack) needs more than a
// 512-thread block may have (ptxas spilled); 256 threads, rows of up to 8192 elements, do not.
template <typename T>
constexpr int kFusedThreads = sizeof(T) == 2 ? 256 : cuda::kMaxRowThreads;

// Rows [rows * c / chunks, rows * (c + 1) / chunks) for block c; grad_x where gx, this chunk's
// grad_weight column sums into partial[c * n ...] where partial.
template <typename T>
__global__ void __launch_bounds__(kFusedThreads<T>)
    fused_kernel(T* gx, cuda::Acc<T>* partial, const T* g, const T* x, const T* w, int64_t rows, int64_t n,
                 int64_t chunks, double eps) {
  using A = cuda::Acc<T>;
  using Row = cuda::CachedRow<T>;
  const int64_t c = blockIdx.x;
  A acc[cuda::kRowPacks][cuda::Pack<T>::kSize] = {};
  const Row wr(w, n);
  for (int64_t r = rows * c / chunks; r < rows * (c + 1) / chunks; ++r) {
    const Row xr(x + r * n, n), gr(g + r * n, n);
    A ss = 0, dot = 0;
    xr.each_zip([&](int, int, A xv, A gv, A wv) {
      ss += xv * xv;
      if (gx) dot += gv * wv * xv;  // grad_x's only
    }, gr, wr);
    if (gx) cuda::block_sum2(ss, dot);
    else ss = cuda::block_sum(ss);
    const A inv = A(1) / sqrt(ss / A(n) + A(eps));
    if (gx) {
      const A coef = inv * inv * (dot / A(n));
      gr.store_zip(gx + r * n, [&](int, int, A gv, A xv, A wv) { return inv * (gv * wv - xv * coef); }, xr, wr);
    }
    if (partial) gr.each_zip([&](int k, int e, A gv, A xv) { acc[k][e] += gv * xv * inv; }, xr);
  }
  if (partial)
    wr.for_packs([&](int k, int64_t j) {
#pragma unroll
      for (int e = 0; e < cuda::Pack<T>::kSize; ++e) partial[c * n + j * cuda::Pack<T>::kSize + e] = acc[k][e];
    });
}

template <typename T>
__global__ void rows_kernel(T* gx, cuda::Acc<T>* inv_out, const T* g, cuda::Indexer g_rows, int64_t g_step,
                            const T* x, cuda::Indexer x_rows, int64_t x_step, const T* w, int64_t w_step,
                            int64_t rows, int64_t n, double eps) {
  using A = cuda::Acc<T>;
  __shared__ A ss_part[kThreads];
  __shared__ A dot_part[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* grow = g + g_rows.offset(r);
    const T* xrow = x + x_rows.offset(r);
    A ss = 0, dot = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const A xi = cuda::load(xrow + i * x_step);
      ss += xi * xi;
      if (gx) dot += cuda::load(grow + i * g_step) * cuda::load(w + i * w_step) * xi;  // grad_x's only
    }
    ss_part[threadIdx.x] = ss;
    dot_part[threadIdx.x] = dot;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
      if (threadIdx.x < s) {
        ss_part[threadIdx.x] += ss_part[threadIdx.x + s];
        dot_part[threadIdx.x] += dot_part[threadIdx.x + s];
      }
      __syncthreads();
    }
    const A inv = A(1) / sqrt(ss_part[0] / A(n) + A(eps));
    const A coef = inv * inv * (dot_part[0] / A(n));
    __syncthreads();  // the sums are read above before the next row overwrites them
    if (threadIdx.x == 0) inv_out[r] = inv;
    if (!gx) continue;  // grad_x not asked for: inv is all grad_weight needs
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const A gw = cuda::load(grow + i * g_step) * cuda::load(w + i * w_step);
      cuda::store(gx + r * n + i, inv * (gw - cuda::load(xrow + i * x_step) * coef));
    }
  }
}

template <typename T>
__global__ void partial_kernel(cuda::Acc<T>* partial, const cuda::Acc<T>* inv, const T* g, cuda::Indexer g_rows,
                               int64_t g_step, const T* x, cuda::Indexer x_rows, int64_t x_step, int64_t rows,
                               int64_t n, int64_t chunks) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t k = blockIdx.y;
  if (i >= n) return;
  cuda::Acc<T> sum = 0;
  for (int64_t r = rows * k / chunks; r < rows * (k + 1) / chunks; ++r)
    sum += cuda::load(g + g_rows.offset(r) + i * g_step) * cuda::load(x + x_rows.offset(r) + i * x_step) * inv[r];
  partial[k * n + i] = sum;
}

template <typename T>
__global__ void combine_kernel(T* gw, const cuda::Acc<T>* partial, int64_t n, int64_t chunks) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    cuda::store(gw + i, cuda::column_sum(partial, i, n, chunks));
  }
}

cuda::Indexer rows_of(const TensorView& t) {
  Dims outer(t.shape.begin(), t.shape.end() - 1);
  Dims outer_strides(t.strides.begin(), t.strides.end() - 1);
  return cuda::make_indexer("rms_norm_backward", outer, outer_strides);
}

void run(const KernelCall& call) {
  const char* op = "rms_norm_backward";
  const TensorView& g = call.tensor("grad");
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("weight");
  const TensorView& gx = call.output(0);
  const TensorView& gw = call.output(1);
  cudaStream_t stream = cuda::stream_of(call);
  const int64_t n = x.size(-1);
  if (n == 0) return;
  const int64_t rows = x.numel() / n;
  if (rows == 0) {  // no rows: grad_weight is an empty sum
    if (gw.nbytes()) cuda::check_cuda(op, cudaMemsetAsync(gw.data, 0, gw.nbytes(), stream), "cudaMemsetAsync");
    return;
  }
  const auto g_rows = rows_of(g), x_rows = rows_of(x);
  const int64_t chunks = rows < kMaxChunks ? rows : kMaxChunks;
  cuda::visit(g.dtype, "rms_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      fail(ErrorKind::not_implemented, "rms_norm_backward(): no integer kernel");
    } else {
      using A = cuda::Acc<T>;
      const int threads = cuda::cached_row_threads(x, g, sizeof(T), {&w});
      if (threads && threads <= kFusedThreads<T> && (!gx.numel() || cuda::aligned16(gx.data))) {
        const int64_t fused_chunks = cuda::row_chunks(rows, threads);
        const cuda::Scratch partials(call, gw.numel() ? sizeof(A) * fused_chunks * n : 0);
        fused_kernel<T><<<unsigned(fused_chunks), threads, 0, stream>>>(
            gx.numel() ? gx.data_as<T>() : nullptr, partials.as<A>(), g.data_as<const T>(), x.data_as<const T>(),
            w.data_as<const T>(), rows, n, fused_chunks, call.attr_float("eps"));
        if (gw.numel())
          combine_kernel<T><<<cuda::blocks_for(n, kThreads), kThreads, 0, stream>>>(gw.data_as<T>(), partials.as<A>(),
                                                                                   n, fused_chunks);
        return cuda::check_launch(op);
      }
      const cuda::Scratch workspace(call, sizeof(A) * (rows + chunks * n));
      A* inv = workspace.as<A>();
      A* partial = inv + rows;
      // Results not asked for (output_mask) are empty: no grad_x stores, or no partial sums.
      rows_kernel<T><<<cuda::row_blocks(rows), kThreads, 0, stream>>>(
          gx.numel() ? gx.data_as<T>() : nullptr, inv, g.data_as<const T>(), g_rows, g.stride(-1),
          x.data_as<const T>(), x_rows,
          x.stride(-1), w.data_as<const T>(), w.stride(0), rows, n, call.attr_float("eps"));
      if (gw.numel()) {
        const dim3 grid(static_cast<unsigned>((n + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
        partial_kernel<T><<<grid, kThreads, 0, stream>>>(partial, inv, g.data_as<const T>(), g_rows, g.stride(-1),
                                                         x.data_as<const T>(), x_rows, x.stride(-1), rows, n, chunks);
        combine_kernel<T><<<cuda::blocks_for(n, kThreads), kThreads, 0, stream>>>(gw.data_as<T>(), partial, n, chunks);
      }
      cuda::check_launch(op);
    }
  });
}

OPFORGE_KERNEL(rms_norm_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::rms_norm_backward_cuda
