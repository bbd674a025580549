// add_one_backward on CUDA: a copy, in 16-byte packs when contiguous (cuda::map_contiguous),
// else a grid-stride loop through the indexer.
#include "opforge/cuda/common.cuh"
#include "opforge/registry.h"

namespace opforge::add_one_backward_cuda {

struct Same {
  template <typename A> __device__ A operator()(A g) const { return g; }
};

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
    if (cuda::try_map_contiguous<T, 1>(out, {&grad}, Same{}, cuda::stream_of(call))) return;
    const int threads = 256;
    kernel<T><<<cuda::blocks_for(out.numel(), threads), threads, 0, cuda::stream_of(call)>>>(
        out.data_as<T>(), grad.data_as<const T>(), ix, grad.is_contiguous(), out.numel());
  });
  cuda::check_launch("add_one_backward");
}

OPFORGE_KERNEL(add_one_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::add_one_backward_cuda
