// add_one on CUDA: contiguous inputs through cuda::map_contiguous; strided ones in a grid-stride
// loop through the indexer.
#include "opforge/cuda/common.cuh"
#include "opforge/registry.h"

namespace opforge::add_one_cuda {

struct PlusOne {
  template <typename A> __device__ A operator()(A x) const { return cuda::wrapping_add(x, A(1)); }
};

template <typename T>
__global__ void kernel(T* out, const T* x, cuda::Indexer ix, bool contiguous, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    cuda::store(out + i, cuda::wrapping_add(cuda::load(x + (contiguous ? i : ix.offset(i))), cuda::Acc<T>(1)));
}

void run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  const TensorView& out = call.output();
  const cuda::Indexer ix = cuda::make_indexer("add_one", x.shape, x.strides);
  cuda::visit(x.dtype, "add_one", [&](auto tag) {
    using T = decltype(tag);
    // Contiguous and 16-byte aligned (the usual case): 16-byte loads and stores, several in
    // flight per thread, which memory-bound kernels need to reach the HBM bandwidth.
    if (cuda::try_map_contiguous<T, 1>(out, {&x}, PlusOne{}, cuda::stream_of(call))) return;
    const int threads = 256;
    kernel<T><<<cuda::blocks_for(out.numel(), threads), threads, 0, cuda::stream_of(call)>>>(
        out.data_as<T>(), x.data_as<const T>(), ix, x.is_contiguous(), out.numel());
  });
  cuda::check_launch("add_one");
}

OPFORGE_KERNEL(add_one, "cuda",
               (std::vector<DType>{DType::float32, DType::float64, DType::float16, DType::bfloat16,
                                   DType::int32, DType::int64}),
               run);

}  // namespace opforge::add_one_cuda
