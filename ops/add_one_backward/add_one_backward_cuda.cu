// add_one_backward on CUDA: a grid-stride copy; strided cotangents go through the indexer.
#include "opforge/cuda/common.cuh"
#include "opforge/registry.h"

namespace opforge::add_one_backward_cuda {

template <typename T>
__global__ void kernel(T* out, const T* grad, cuda::Indexer ix, bool contiguous, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = grad[contiguous ? i : ix.offset(i)];
}

void run(const KernelCall& call) {
  const TensorView& grad = call.tensor("grad");
  const TensorView& out = call.output();
  const cuda::Indexer ix = cuda::make_indexer("add_one_backward", grad.shape, grad.strides);
  cuda::visit(grad.dtype, "add_one_backward", [&](auto tag) {
    using T = decltype(tag);
    const int threads = 256;
    kernel<T><<<cuda::blocks_for(out.numel(), threads), threads, 0, cuda::stream_of(call)>>>(
        out.data_as<T>(), grad.data_as<const T>(), ix, grad.is_contiguous(), out.numel());
  });
  cuda::check_launch("add_one_backward");
}

OPFORGE_KERNEL(add_one_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::add_one_backward_cuda
