// softmax_backward on CUDA: one block per row; a block-wide sum of grad * y, then
// y * (grad - sum). grad and result broadcast over the output's leading dimensions.
#include "opforge/cuda/rows.cuh"
#include "opforge/registry.h"

namespace opforge::softmax_backward_cuda {

constexpr int kThreads = 256;  // a multiple of 32

template <typename T>
__global__ void kernel(T* out, const T* g, cuda::Indexer g_rows, int64_t g_step, const T* y, cuda::Indexer y_rows,
                       int64_t y_step, int64_t rows, int64_t n) {
  using A = cuda::Acc<T>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* grow = g + g_rows.offset(r);
    const T* yrow = y + y_rows.offset(r);
    A dot = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dot += cuda::load(grow + i * g_step) * cuda::load(yrow + i * y_step);
    dot = cuda::block_sum(dot);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      cuda::store(out + r * n + i, cuda::load(yrow + i * y_step) * (cuda::load(grow + i * g_step) - dot));
  }
}

// The leading dimensions of t's strides broadcast to the output's shape.
cuda::Indexer rows_of(const TensorView& t, const std::vector<int64_t>& shape) {
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
      const unsigned blocks = static_cast<unsigned>(rows < 65535 * 16 ? rows : 65535 * 16);
      kernel<T><<<blocks, kThreads, 0, cuda::stream_of(call)>>>(out.data_as<T>(), g.data_as<const T>(), g_rows, g.stride(-1),
                                                                y.data_as<const T>(), y_rows, y.stride(-1), rows, n);
    }
  });
  cuda::check_launch("softmax_backward");
}

OPFORGE_KERNEL(softmax_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::softmax_backward_cuda
