// rms_norm on CUDA: one block per row (cuda/rows.cuh): a block-wide sum of squares, then the
// scaled store. Contiguous aligned rows are read once into registers (CachedRow).
#include <cmath>

#include "opforge/cuda/rows.cuh"
#include "opforge/registry.h"

namespace opforge::rms_norm_cuda {

constexpr int kThreads = 256;  // for strided rows

template <typename T, class Row>
__device__ __forceinline__ void normalize(T* out, const Row& row, const T* w, int64_t w_stride, int64_t n, double eps) {
  using A = cuda::Acc<T>;
  A sum = 0;
  row.each([&](int64_t, A v) { sum += v * v; });
  const A inv = A(1) / sqrt(cuda::block_sum(sum) / A(n) + A(eps));
  row.store(out, cuda::Columns<T, 1>{{w}, {w_stride}}, [&](A v, const A* c) { return v * inv * c[0]; });
}

template <typename T>
__global__ void strided_kernel(T* out, const T* x, cuda::Indexer rows_ix, int64_t col_stride, const T* w,
                               int64_t w_stride, int64_t rows, int64_t n, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    normalize(out + r * n, cuda::StridedRow<T>{x + rows_ix.offset(r), col_stride, n}, w, w_stride, n, eps);
}

template <typename T>
__global__ void __launch_bounds__(cuda::kMaxRowThreads) cached_kernel(T* out, const T* x, const T* w, int64_t w_stride, int64_t rows, int64_t n, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    normalize(out + r * n, cuda::CachedRow<T>(x + r * n, n), w, w_stride, n, eps);
}

void run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("weight");
  const TensorView& out = call.output();
  const int64_t n = x.size(-1);
  if (n == 0) return;
  const int64_t rows = x.numel() / n;
  std::vector<int64_t> outer(x.shape.begin(), x.shape.end() - 1);
  std::vector<int64_t> outer_strides(x.strides.begin(), x.strides.end() - 1);
  const auto rows_ix = cuda::make_indexer("rms_norm", outer, outer_strides);
  const double eps = call.attr_float("eps");
  cuda::visit(x.dtype, "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      fail(ErrorKind::not_implemented, "rms_norm(): no integer kernel");
    } else {
      const cudaStream_t stream = cuda::stream_of(call);
      if (const int threads = cuda::cached_row_threads(x, out, sizeof(T), {&w})) {
        cached_kernel<T><<<cuda::row_blocks(rows), threads, 0, stream>>>(
            out.data_as<T>(), x.data_as<const T>(), w.data_as<const T>(), w.stride(0), rows, n, eps);
      } else {
        strided_kernel<T><<<cuda::row_blocks(rows), kThreads, 0, stream>>>(
            out.data_as<T>(), x.data_as<const T>(), rows_ix, x.stride(-1), w.data_as<const T>(), w.stride(0), rows,
            n, eps);
      }
    }
  });
  cuda::check_launch("rms_norm");
}

OPFORGE_KERNEL(rms_norm, "cuda", float_dtypes(), run);

}  // namespace opforge::rms_norm_cuda
