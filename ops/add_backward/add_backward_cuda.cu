// add_backward on CUDA: each operand's gradient sums grad over the dimensions the operand
// was broadcast along. Short sums: one thread per output, summing in order. Long sums: one
// block per output, threads striding the summed range, then a fixed shared-memory tree.
// Both orders depend on the shapes only, so results are bitwise repeatable.
#include "opforge/cuda/common.cuh"
#include "opforge/registry.h"

namespace opforge::add_backward_cuda {

constexpr int kThreads = 256;

template <typename T>
__global__ void per_thread(T* out, const T* grad, cuda::Indexer kept, cuda::Indexer summed, int64_t m, int64_t r) {
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < m; o += int64_t(gridDim.x) * blockDim.x) {
    const T* base = grad + kept.offset(o);
    cuda::Acc<T> sum = 0;
    for (int64_t i = 0; i < r; ++i) sum += cuda::load(base + summed.offset(i));
    cuda::store(out + o, sum);
  }
}

template <typename T>
__global__ void per_block(T* out, const T* grad, cuda::Indexer kept, cuda::Indexer summed, int64_t m, int64_t r) {
  using A = cuda::Acc<T>;
  __shared__ A partial[kThreads];
  for (int64_t o = blockIdx.x; o < m; o += gridDim.x) {
    const T* base = grad + kept.offset(o);
    A sum = 0;
    for (int64_t i = threadIdx.x; i < r; i += kThreads) sum += cuda::load(base + summed.offset(i));
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s /= 2) {
      if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
      __syncthreads();
    }
    if (threadIdx.x == 0) cuda::store(out + o, partial[0]);
    __syncthreads();  // partial[0] is read above before the next output overwrites it
  }
}

void reduce(const KernelCall& call, const TensorView& grad, const TensorView& out) {
  if (out.numel() == 0) return;
  cudaStream_t stream = cuda::stream_of(call);
  if (grad.numel() == 0) {  // a size-0 dimension summed away: the sum of nothing
    const cudaError_t status = cudaMemsetAsync(out.data, 0, out.nbytes(), stream);
    if (status != cudaSuccess)
      fail(ErrorKind::runtime, "add_backward(): cudaMemsetAsync failed: ", cudaGetErrorString(status));
    return;
  }
  // grad's dimensions split into those out keeps (out is row-major over them) and summed ones.
  std::vector<int64_t> kept_size, kept_stride, red_size, red_stride;
  const size_t lead = grad.shape.size() - out.shape.size();
  bool inner_kept = true;
  for (size_t d = 0; d < grad.shape.size(); ++d) {
    if (grad.shape[d] == 1) continue;
    inner_kept = d >= lead && out.shape[d - lead] == grad.shape[d];
    (inner_kept ? kept_size : red_size).push_back(grad.shape[d]);
    (inner_kept ? kept_stride : red_stride).push_back(grad.strides[d]);
  }
  const auto kept = cuda::make_indexer("add_backward", kept_size, kept_stride);
  const auto summed = cuda::make_indexer("add_backward", red_size, red_stride);
  const int64_t m = out.numel(), r = grad.numel() / m;
  // Threads per output when sums are short, or when neighbouring threads read neighbouring
  // grad elements and there are enough outputs to fill the GPU.
  const bool threads_per_output = r < kThreads || (inner_kept && m >= 16 * kThreads);
  cuda::visit(grad.dtype, "add_backward", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      fail(ErrorKind::not_implemented, "add_backward(): no integer kernel");
    } else if (threads_per_output) {
      per_thread<T><<<cuda::blocks_for(m, kThreads), kThreads, 0, stream>>>(
          out.data_as<T>(), grad.data_as<const T>(), kept, summed, m, r);
    } else {
      const unsigned blocks = static_cast<unsigned>(m < 65535 * 16 ? m : 65535 * 16);
      per_block<T><<<blocks, kThreads, 0, stream>>>(out.data_as<T>(), grad.data_as<const T>(), kept, summed, m, r);
    }
  });
  cuda::check_launch("add_backward");
}

void run(const KernelCall& call) {
  const TensorView& grad = call.tensor("grad");
  reduce(call, grad, call.output(0));
  reduce(call, grad, call.output(1));
}

OPFORGE_KERNEL(add_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::add_backward_cuda
