// softmax_backward on CUDA: one block per row (cuda/rows.cuh: grad's and the result's rows read
// once into registers when laid out as the output); a block-wide sum of grad * y, then
// y * (grad - sum). grad and result broadcast over the output's leading dimensions.
#include "opforge/cuda/rows.cuh"
#include "opforge/registry.h"

namespace opforge::softmax_backward_cuda {

constexpr int kThreads = 256;  // a multiple of 32

template <typename T, class Row>
__device__ __forceinline__ void backward_row(T* out, const Row& g, const Row& y) {
  using A = cuda::Acc<T>;
  A dot = 0;
  g.each_with(y, [&](A gi, A yi) { dot += gi * yi; });
  dot = cuda::block_sum(dot);
  g.store_with(out, y, [&](A gi, A yi) { return yi * (gi - dot); });
}

template <typename T>
__global__ void strided_kernel(T* out, const T* g, cuda::Indexer g_rows, int64_t g_step, const T* y,
                               cuda::Indexer y_rows, int64_t y_step, int64_t rows, int64_t n) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    backward_row(out + r * n, cuda::StridedRow<T>{g + g_rows.offset(r), g_step, n},
                 cuda::StridedRow<T>{y + y_rows.offset(r), y_step, n});
}

template <typename T>
__global__ void __launch_bounds__(cuda::kMaxRowThreads) cached_kernel(T* out, const T* g, const T* y, int64_t rows,
                                                                     int64_t n) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    backward_row(out + r * n, cuda::CachedRow<T>(g + r * n, n), cuda::CachedRow<T>(y + r * n, n));
}

// The leading dimensions of t's strides broadcast to the output's shape.
cuda::Indexer rows_of(const TensorView& t, const Dims& shape) {
  const auto strides = broadcast_strides(t, shape);
  return cuda::make_indexer("softmax_backward", {shape.begin(), shape.end() - 1}, {strides.begin(), strides.end() - 1});
}

void run(const KernelCall& call) {
  const TensorView& g = call.tensor("grad");
  const TensorView& y = call.tensor("result");
  const TensorView& out = call.output();
  const int64_t n = out.size(-1);
  if (n == 0) return;
  const int64_t rows = out.numel() / n;
  const auto g_rows = rows_of(g, out.shape), y_rows = rows_of(y, out.shape);
  cuda::visit(g.dtype, "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      fail(ErrorKind::not_implemented, "softmax_backward(): no integer kernel");
    } else {
      const cudaStream_t stream = cuda::stream_of(call);
      // Both rows cached when grad and result are laid out as the output (no broadcasting).
      const int threads = g.shape == out.shape && y.shape == out.shape ? cuda::cached_row_threads(g, out, sizeof(T))
                                                                       : 0;
      if (threads && cuda::cached_row_threads(y, out, sizeof(T))) {
        cached_kernel<T><<<cuda::row_blocks(rows), threads, 0, stream>>>(out.data_as<T>(), g.data_as<const T>(),
                                                                          y.data_as<const T>(), rows, n);
      } else {
        strided_kernel<T><<<cuda::row_blocks(rows), kThreads, 0, stream>>>(
            out.data_as<T>(), g.data_as<const T>(), g_rows, g.stride(-1), y.data_as<const T>(), y_rows, y.stride(-1),
            rows, n);
      }
    }
  });
  cuda::check_launch("softmax_backward");
}

OPFORGE_KERNEL(softmax_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::softmax_backward_cuda
