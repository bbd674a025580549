// add on CUDA: same-shape contiguous operands in 16-byte packs (cuda::map_contiguous); others
// broadcast through per-operand indexers (stride 0 on broadcast dims).
#include "opforge/cuda/common.cuh"
#include "opforge/registry.h"

namespace opforge::add_cuda {

struct Plus {
  template <typename A> __device__ A operator()(A a, A b) const { return cuda::wrapping_add(a, b); }
};

template <typename T>
__global__ void kernel(T* out, const T* x, cuda::Indexer ix, const T* y, cuda::Indexer iy, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    cuda::store(out + i, cuda::wrapping_add(cuda::load(x + ix.offset(i)), cuda::load(y + iy.offset(i))));
}

void run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  const TensorView& y = call.tensor("y");
  const TensorView& out = call.output();
  const auto ix = cuda::make_indexer("add", out.shape, broadcast_strides(x, out.shape));
  const auto iy = cuda::make_indexer("add", out.shape, broadcast_strides(y, out.shape));
  cuda::visit(x.dtype, "add", [&](auto tag) {
    using T = decltype(tag);
    if (cuda::try_map_contiguous<T, 2>(out, {&x, &y}, Plus{}, cuda::stream_of(call))) return;
    const int threads = 256;
    kernel<T><<<cuda::blocks_for(out.numel(), threads), threads, 0, cuda::stream_of(call)>>>(
        out.data_as<T>(), x.data_as<const T>(), ix, y.data_as<const T>(), iy, out.numel());
  });
  cuda::check_launch("add");
}

OPFORGE_KERNEL(add, "cuda",
               (std::vector<DType>{DType::float32, DType::float64, DType::float16, DType::bfloat16,
                                   DType::int32, DType::int64}),
               run);

}  // namespace opforge::add_cuda
