// rms_norm on CUDA: one block per row; a block-wide sum of squares in shared memory.
#include <cmath>

#include "opforge/cuda/common.cuh"
#include "opforge/registry.h"

namespace opforge::rms_norm_cuda {

constexpr int kThreads = 256;

template <typename T>
__global__ void kernel(T* out, const T* x, cuda::Indexer rows_ix, int64_t col_stride, const T* w,
                       int64_t w_stride, int64_t rows, int64_t n, double eps) {
  using A = cuda::Acc<T>;
  __shared__ A partial[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + rows_ix.offset(r);
    A sum = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const A v = cuda::load(row + i * col_stride);
      sum += v * v;
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
      if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
      __syncthreads();
    }
    const A inv = A(1) / sqrt(partial[0] / A(n) + A(eps));
    __syncthreads();  // partial[0] is read above before the next row overwrites it
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      cuda::store(out + r * n + i, cuda::load(row + i * col_stride) * inv * cuda::load(w + i * w_stride));
  }
}

void run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("weight");
  const TensorView& out = call.output();
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  std::vector<int64_t> outer(x.shape.begin(), x.shape.end() - 1);
  std::vector<int64_t> outer_strides(x.strides.begin(), x.strides.end() - 1);
  const auto rows_ix = cuda::make_indexer("rms_norm", outer, outer_strides);
  cuda::visit(x.dtype, "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      fail(ErrorKind::not_implemented, "rms_norm(): no integer kernel");
    } else {
      const unsigned blocks = static_cast<unsigned>(rows < 65535 * 16 ? rows : 65535 * 16);
      kernel<T><<<blocks, kThreads, 0, cuda::stream_of(call)>>>(out.data_as<T>(), x.data_as<const T>(), rows_ix,
                                                                x.stride(-1), w.data_as<const T>(), w.stride(0),
                                                                rows, n, call.attr_float("eps"));
    }
  });
  cuda::check_launch("rms_norm");
}

OPFORGE_KERNEL(rms_norm, "cuda", float_dtypes(), run);

}  // namespace opforge::rms_norm_cuda
