// softmax on CUDA: one block per row; block-wide max, then sum of exp(x - max), then the
// scaled store. A row holding NaN or +inf is NaN throughout, as in torch.
#include <cmath>

#include "opforge/cuda/common.cuh"
#include "opforge/registry.h"

namespace opforge::softmax_cuda {

constexpr int kThreads = 256;  // a multiple of 32

// Reduces v over the block with op; every thread gets the result. shared holds 32 values.
template <typename A, typename Op>
__device__ A block_reduce(A v, A* shared, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // shared may still be read from the previous reduction
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  v = shared[0];
  for (int w = 1; w < blockDim.x / 32; ++w) v = op(v, shared[w]);
  return v;
}

template <typename T>
__global__ void kernel(T* out, const T* x, cuda::Indexer rows_ix, int64_t step, int64_t rows, int64_t n) {
  using A = cuda::Acc<T>;
  __shared__ A shared[32];
  const A inf = INFINITY;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + rows_ix.offset(r);
    A m = -inf;
    int bad = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const A v = cuda::load(row + i * step);
      bad |= !(v < inf);
      m = fmax(m, v);
    }
    bad = __syncthreads_or(bad);
    m = block_reduce(m, shared, [](A a, A b) { return fmax(a, b); });
    A s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += exp(cuda::load(row + i * step) - m);
    s = block_reduce(s, shared, [](A a, A b) { return a + b; });  // NaN when every entry is -inf
    const A inv = bad ? A(NAN) : A(1) / s;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      cuda::store(out + r * n + i, exp(cuda::load(row + i * step) - m) * inv);
  }
}

void run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  const TensorView& out = call.output();
  const int64_t n = x.size(-1);
  if (n == 0) return;
  const int64_t rows = x.numel() / n;
  std::vector<int64_t> outer(x.shape.begin(), x.shape.end() - 1);
  std::vector<int64_t> outer_strides(x.strides.begin(), x.strides.end() - 1);
  const auto rows_ix = cuda::make_indexer("softmax", outer, outer_strides);
  cuda::visit(x.dtype, "softmax", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      fail(ErrorKind::not_implemented, "softmax(): no integer kernel");
    } else {
      const unsigned blocks = static_cast<unsigned>(rows < 65535 * 16 ? rows : 65535 * 16);
      kernel<T><<<blocks, kThreads, 0, cuda::stream_of(call)>>>(out.data_as<T>(), x.data_as<const T>(), rows_ix,
                                                                x.stride(-1), rows, n);
    }
  });
  cuda::check_launch("softmax");
}

OPFORGE_KERNEL(softmax, "cuda", float_dtypes(), run);

}  // namespace opforge::softmax_cuda
