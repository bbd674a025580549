// layer_norm on CUDA: one block per row (cuda/rows.cuh; contiguous aligned rows read once into
// registers); block sums of x - x[0] (the mean), then of d^2 and d with d = x - mean (variance,
// refined mean), then the store. As in the CPU kernel, the mean
// is kept as base + mu (TwoSum) and subtracted in two steps, so a large mean costs no precision.
#include <cmath>

#include "opforge/cuda/rows.cuh"
#include "opforge/registry.h"

namespace opforge::layer_norm_cuda {

constexpr int kThreads = 256;  // for strided rows

template <typename T, class Row>
__device__ __forceinline__ void normalize(T* out, const Row& row, const T* first, const T* w, int64_t w_step,
                                          const T* b, int64_t b_step, int64_t n, double eps) {
  using A = cuda::Acc<T>;
  const A shift = cuda::load(first);  // x[0] of the row
  A sum = 0;
  row.each([&](int64_t, A v) { sum += v - shift; });
  const A approx = cuda::block_sum(sum) / A(n);
  const A base = shift + approx;  // TwoSum: base + mu == shift + approx exactly
  const A back = base - shift;
  A mu = (shift - (base - back)) + (approx - back);
  A ss = 0, c = 0;
  row.each([&](int64_t, A v) {
    const A d = (v - base) - mu;
    ss += d * d;
    c += d;
  });
  ss = cuda::block_sum(ss);
  const A correction = cuda::block_sum(c) / A(n);
  mu += correction;
  const A var = fmax(ss / A(n) - correction * correction, A(0));
  const A rstd = A(1) / sqrt(var + A(eps));
  const auto y = [&](A v, const A* c) { return ((v - base) - mu) * rstd * c[0]; };
  if (b) row.store(out, cuda::Columns<T, 2>{{w, b}, {w_step, b_step}}, [&](A v, const A* c) { return y(v, c) + c[1]; });
  else row.store(out, cuda::Columns<T, 1>{{w}, {w_step}}, y);
}

template <typename T>
__global__ void strided_kernel(T* out, const T* x, cuda::Indexer rows_ix, int64_t step, const T* w, int64_t w_step,
                               const T* b, int64_t b_step, int64_t rows, int64_t n, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + rows_ix.offset(r);
    normalize(out + r * n, cuda::StridedRow<T>{row, step, n}, row, w, w_step, b, b_step, n, eps);
  }
}

template <typename T>
__global__ void __launch_bounds__(cuda::kMaxRowThreads) cached_kernel(T* out, const T* x, const T* w, int64_t w_step, const T* b, int64_t b_step,
                              int64_t rows, int64_t n, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    normalize(out + r * n, cuda::CachedRow<T>(x + r * n, n), x + r * n, w, w_step, b, b_step, n, eps);
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
      const cudaStream_t stream = cuda::stream_of(call);
      const T* bias = b ? b->data_as<const T>() : nullptr;
      const int64_t b_step = b ? b->stride(0) : 0;
      const double eps = call.attr_float("eps");
      if (const int threads = cuda::cached_row_threads(x, out, sizeof(T), {&w, b})) {
        cached_kernel<T><<<cuda::row_blocks(rows), threads, 0, stream>>>(
            out.data_as<T>(), x.data_as<const T>(), w.data_as<const T>(), w.stride(0), bias, b_step, rows, n, eps);
      } else {
        strided_kernel<T><<<cuda::row_blocks(rows), kThreads, 0, stream>>>(
            out.data_as<T>(), x.data_as<const T>(), rows_ix, x.stride(-1), w.data_as<const T>(), w.stride(0), bias,
            b_step, rows, n, eps);
      }
    }
  });
  cuda::check_launch("layer_norm");
}

OPFORGE_KERNEL(layer_norm, "cuda", float_dtypes(), run);

}  // namespace opforge::layer_norm_cuda
