// softmax on CUDA: one block per row (cuda/rows.cuh; contiguous aligned rows read once into
// registers), or one warp per row for rows side by side (cuda/panel_rows.cuh); the row's max,
// then sum of exp(x - max), then the scaled store. A row holding NaN or +inf is NaN throughout,
// as in torch.
#include <cmath>

#include "opforge/cuda/panel_rows.cuh"
#include "opforge/registry.h"

namespace opforge::softmax_cuda {

constexpr int kThreads = 256;  // for strided rows

template <typename T, class Row>
__device__ __forceinline__ void softmax_row(T* out, const Row& row) {
  using A = cuda::Acc<T>;
  const A inf = INFINITY;
  A m = -inf;
  int bad = 0;
  row.each([&](int64_t, A v) {
    bad |= !(v < inf);
    m = fmax(m, v);
  });
  bad = cuda::row_any(row, bad);
  m = cuda::row_reduce(row, m, cuda::Max{});
  A s = 0;
  row.each([&](int64_t, A v) { s += exp(v - m); });
  s = cuda::row_sum(row, s);  // NaN when every entry is -inf
  const A inv = bad ? A(NAN) : A(1) / s;
  row.store(out, [&](int64_t, A v) { return exp(v - m) * inv; });
}

template <typename T>
__global__ void strided_kernel(T* out, const T* x, cuda::Indexer rows_ix, int64_t step, int64_t rows, int64_t n) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    softmax_row(out + r * n, cuda::StridedRow<T>{x + rows_ix.offset(r), step, n});
}

template <typename T>
__global__ void __launch_bounds__(cuda::PanelRow<T>::kThreads)
    panel_kernel(T* out, const T* x, cuda::Indexer rows_ix, int64_t step, cuda::Panels panels, int64_t n) {
  for (int64_t p = blockIdx.x; p < panels.count; p += gridDim.x) {
    const int64_t first = panels.first(p);
    softmax_row(out + (first + threadIdx.x / 32) * n,
                cuda::PanelRow<T>{x + rows_ix.offset(first), step, n, panels.rows(p)});
  }
}

template <typename T>
__global__ void __launch_bounds__(cuda::kMaxRowThreads) cached_kernel(T* out, const T* x, int64_t rows, int64_t n) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) softmax_row(out + r * n, cuda::CachedRow<T>(x + r * n, n));
}

void run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  const TensorView& out = call.output();
  const int64_t n = x.size(-1);
  if (n == 0) return;
  const int64_t rows = x.numel() / n;
  Dims outer(x.shape.begin(), x.shape.end() - 1);
  Dims outer_strides(x.strides.begin(), x.strides.end() - 1);
  const auto rows_ix = cuda::make_indexer("softmax", outer, outer_strides);
  cuda::visit(x.dtype, "softmax", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      fail(ErrorKind::not_implemented, "softmax(): no integer kernel");
    } else {
      const cudaStream_t stream = cuda::stream_of(call);
      if (const int threads = cuda::cached_row_threads(x, out, sizeof(T))) {
        cached_kernel<T><<<cuda::row_blocks(rows), threads, 0, stream>>>(out.data_as<T>(), x.data_as<const T>(), rows,
                                                                          n);
      } else if (const cuda::Panels panels = cuda::side_by_side_panels<T>(x); panels.count) {
        panel_kernel<T><<<cuda::row_blocks(panels.count), cuda::PanelRow<T>::kThreads, 0, stream>>>(
            out.data_as<T>(), x.data_as<const T>(), rows_ix, x.stride(-1), panels, n);
      } else {
        strided_kernel<T><<<cuda::row_blocks(rows), kThreads, 0, stream>>>(out.data_as<T>(), x.data_as<const T>(),
                                                                            rows_ix, x.stride(-1), rows, n);
      }
    }
  });
  cuda::check_launch("softmax");
}

OPFORGE_KERNEL(softmax, "cuda", float_dtypes(), run);

}  // namespace opforge::softmax_cuda
