// mul_backward on CUDA: each operand's gradient sums grad * other over the dimensions the
// operand was broadcast along (the other operand read through broadcast strides). Short sums:
// one thread per output, summing in order. Long sums: one block per output, threads striding
// the summed range, then a fixed shared-memory tree. Both orders depend on the shapes only,
// so results are bitwise repeatable.
#include "opforge/cuda/common.cuh"
#include "opforge/registry.h"

namespace opforge::mul_backward_cuda {

constexpr int kThreads = 256;

// Where the terms of one gradient live: grad and the other operand, each split into the
// dimensions the result keeps and those it sums.
struct Walk {
  cuda::Indexer g_kept, g_summed, o_kept, o_summed;
};

template <typename T>
__global__ void per_thread(T* out, const T* grad, const T* other, Walk w, int64_t m, int64_t r) {
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < m; o += int64_t(gridDim.x) * blockDim.x) {
    const T* g = grad + w.g_kept.offset(o);
    const T* b = other + w.o_kept.offset(o);
    cuda::Acc<T> sum = 0;
    for (int64_t i = 0; i < r; ++i) sum += cuda::load(g + w.g_summed.offset(i)) * cuda::load(b + w.o_summed.offset(i));
    cuda::store(out + o, sum);
  }
}

template <typename T>
__global__ void per_block(T* out, const T* grad, const T* other, Walk w, int64_t m, int64_t r) {
  using A = cuda::Acc<T>;
  __shared__ A partial[kThreads];
  for (int64_t o = blockIdx.x; o < m; o += gridDim.x) {
    const T* g = grad + w.g_kept.offset(o);
    const T* b = other + w.o_kept.offset(o);
    A sum = 0;
    for (int64_t i = threadIdx.x; i < r; i += kThreads)
      sum += cuda::load(g + w.g_summed.offset(i)) * cuda::load(b + w.o_summed.offset(i));
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

// out = grad * other summed down to out's shape; other is broadcast to grad's shape.
void reduce(const KernelCall& call, const TensorView& grad, const TensorView& other, const TensorView& out) {
  if (out.numel() == 0) return;
  cudaStream_t stream = cuda::stream_of(call);
  if (grad.numel() == 0) {  // a size-0 dimension summed away: the sum of nothing
    const cudaError_t status = cudaMemsetAsync(out.data, 0, out.nbytes(), stream);
    if (status != cudaSuccess)
      fail(ErrorKind::runtime, "mul_backward(): cudaMemsetAsync failed: ", cudaGetErrorString(status));
    return;
  }
  const std::vector<int64_t> other_strides = broadcast_strides(other, grad.shape);
  std::vector<int64_t> kept_size, red_size, g_kept, g_red, o_kept, o_red;
  const size_t lead = grad.shape.size() - out.shape.size();
  bool inner_kept = true;
  for (size_t d = 0; d < grad.shape.size(); ++d) {
    if (grad.shape[d] == 1) continue;
    inner_kept = d >= lead && out.shape[d - lead] == grad.shape[d];
    (inner_kept ? kept_size : red_size).push_back(grad.shape[d]);
    (inner_kept ? g_kept : g_red).push_back(grad.strides[d]);
    (inner_kept ? o_kept : o_red).push_back(other_strides[d]);
  }
  const Walk w{cuda::make_indexer("mul_backward", kept_size, g_kept), cuda::make_indexer("mul_backward", red_size, g_red),
               cuda::make_indexer("mul_backward", kept_size, o_kept), cuda::make_indexer("mul_backward", red_size, o_red)};
  const int64_t m = out.numel(), r = grad.numel() / m;
  // Threads per output when sums are short, or when neighbouring threads read neighbouring
  // elements and there are enough outputs to fill the GPU.
  const bool threads_per_output = r < kThreads || (inner_kept && m >= 16 * kThreads);
  cuda::visit(grad.dtype, "mul_backward", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      fail(ErrorKind::not_implemented, "mul_backward(): no integer kernel");
    } else if (threads_per_output) {
      per_thread<T><<<cuda::blocks_for(m, kThreads), kThreads, 0, stream>>>(
          out.data_as<T>(), grad.data_as<const T>(), other.data_as<const T>(), w, m, r);
    } else {
      const unsigned blocks = static_cast<unsigned>(m < 65535 * 16 ? m : 65535 * 16);
      per_block<T><<<blocks, kThreads, 0, stream>>>(out.data_as<T>(), grad.data_as<const T>(),
                                                   other.data_as<const T>(), w, m, r);
    }
  });
  cuda::check_launch("mul_backward");
}

void run(const KernelCall& call) {
  const TensorView& grad = call.tensor("grad");
  reduce(call, grad, call.tensor("y"), call.output(0));
  reduce(call, grad, call.tensor("x"), call.output(1));
}

OPFORGE_KERNEL(mul_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::mul_backward_cuda
