// rms_norm's CUDA kernels: one block per row (cuda/rows.cuh), or one warp per row for rows side
// by side (cuda/panel_rows.cuh): the row's sum of squares, then the scaled store. Here, apart
// from the launches in rms_norm_cuda.cu, so that bench/schedules_cuda.cu can time
// contiguous_kernel with other row schedules.
#pragma once

#include <cmath>

#include "opforge/cuda/panel_rows.cuh"

namespace opforge::rms_norm_cuda {

constexpr int kThreads = 256;  // for strided rows

// The schedule the op runs contiguous rows with: the row type (cuda/rows.cuh), its packs per thread
// and its loads and stores. bench/schedules_cuda.cu times other schedules beside this one (other
// packs and accesses, cuda/schedule_variants.cuh's rows); adopting one is changing this line.
template <typename T>
using OwnRow = cuda::CachedRow<T, cuda::kRowPacks, cuda::PlainAccess>;

template <typename T, class Row>
__device__ __forceinline__ void normalize(T* out, const Row& row, const T* w, int64_t w_stride, int64_t n, double eps) {
  using A = cuda::Acc<T>;
  A sum = 0;
  row.each([&](int64_t, A v) { sum += v * v; });
  const A inv = A(1) / sqrt(cuda::row_sum(row, sum) / A(n) + A(eps));
  row.store(out, cuda::Columns<T, 1>{{w}, {w_stride}}, [&](A v, const A* c) { return v * inv * c[0]; });
}

template <typename T>
__global__ void strided_kernel(T* out, const T* x, cuda::Indexer rows_ix, int64_t col_stride, const T* w,
                               int64_t w_stride, int64_t rows, int64_t n, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    normalize(out + r * n, cuda::StridedRow<T>{x + rows_ix.offset(r), col_stride, n}, w, w_stride, n, eps);
}

// Rows side by side (cuda/panel_rows.cuh): a panel of them per block, one per warp.
template <typename T>
__global__ void __launch_bounds__(cuda::PanelRow<T>::kThreads)
    panel_kernel(T* out, const T* x, cuda::Indexer rows_ix, int64_t col_stride, cuda::Panels panels, const T* w,
                 int64_t w_stride, int64_t n, double eps) {
  for (int64_t p = blockIdx.x; p < panels.count; p += gridDim.x) {
    const int64_t first = panels.first(p);
    normalize(out + (first + threadIdx.x / 32) * n,
              cuda::PanelRow<T>{x + rows_ix.offset(first), col_stride, n, panels.rows(p)}, w, w_stride, n, eps);
  }
}

// Contiguous aligned rows of type Row (OwnRow<T>, or a schedule bench/schedules_cuda.cu times),
// cuda::contiguous_row_threads<Row> threads per block.
template <typename T, class Row = OwnRow<T>>
__global__ void __launch_bounds__(cuda::kMaxRowThreads)
    contiguous_kernel(T* out, const T* x, const T* w, int64_t w_stride, int64_t rows, int64_t n, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    normalize(out + r * n, Row(x + r * n, n), w, w_stride, n, eps);
}

}  // namespace opforge::rms_norm_cuda
