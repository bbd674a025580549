// layer_norm on CUDA: one block per row; block sums of x - x[0] (the mean), then of d^2 and d
// with d = x - mean (variance, refined mean), then the store. As in the CPU kernel, the mean
// is kept as base + mu (TwoSum) and subtracted in two steps, so a large mean costs no precision.
#include <cmath>

#include "opforge/cuda/common.cuh"
#include "opforge/registry.h"

namespace opforge::layer_norm_cuda {

constexpr int kThreads = 256;  // a multiple of 32

template <typename A>
__device__ A block_sum(A v, A* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // shared may still be read from the previous sum
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  v = shared[0];
  for (int w = 1; w < blockDim.x / 32; ++w) v += shared[w];
  return v;
}

template <typename T>
__global__ void kernel(T* out, const T* x, cuda::Indexer rows_ix, int64_t step, const T* w, int64_t w_step,
                       const T* b, int64_t b_step, int64_t rows, int64_t n, double eps) {
  using A = cuda::Acc<T>;
  __shared__ A shared[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + rows_ix.offset(r);
    const A shift = cuda::load(row);
    A sum = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += cuda::load(row + i * step) - shift;
    const A approx = block_sum(sum, shared) / A(n);
    const A base = shift + approx;  // TwoSum: base + mu == shift + approx exactly
    const A back = base - shift;
    A mu = (shift - (base - back)) + (approx - back);
    A ss = 0, c = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const A d = (cuda::load(row + i * step) - base) - mu;
      ss += d * d;
      c += d;
    }
    ss = block_sum(ss, shared);
    const A correction = block_sum(c, shared) / A(n);
    mu += correction;
    const A var = fmax(ss / A(n) - correction * correction, A(0));
    const A rstd = A(1) / sqrt(var + A(eps));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const A y = ((cuda::load(row + i * step) - base) - mu) * rstd * cuda::load(w + i * w_step);
      cuda::store(out + r * n + i, b ? y + cuda::load(b + i * b_step) : y);
    }
  }
}

void run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("weight");
  const TensorView* b = call.optional_tensor("bias");
  const TensorView& out = call.output();
  const int64_t n = x.size(-1);
  if (n == 0) return;
  const int64_t rows = x.numel() / n;
  std::vector<int64_t> outer(x.shape.begin(), x.shape.end() - 1);
  std::vector<int64_t> outer_strides(x.strides.begin(), x.strides.end() - 1);
  const auto rows_ix = cuda::make_indexer("layer_norm", outer, outer_strides);
  cuda::visit(x.dtype, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      fail(ErrorKind::not_implemented, "layer_norm(): no integer kernel");
    } else {
      const unsigned blocks = static_cast<unsigned>(rows < 65535 * 16 ? rows : 65535 * 16);
      kernel<T><<<blocks, kThreads, 0, cuda::stream_of(call)>>>(
          out.data_as<T>(), x.data_as<const T>(), rows_ix, x.stride(-1), w.data_as<const T>(), w.stride(0),
          b ? b->data_as<const T>() : nullptr, b ? b->stride(0) : 0, rows, n, call.attr_float("eps"));
    }
  });
  cuda::check_launch("layer_norm");
}

OPFORGE_KERNEL(layer_norm, "cuda", float_dtypes(), run);

}  // namespace opforge::layer_norm_cuda
