// layer_norm's CUDA kernels: one block per row (cuda/rows.cuh), or one warp per row for rows side
// by side (cuda/panel_rows.cuh); the row's sums of x - x[0] (the mean), then of d^2 and d
// together with d = x - mean (variance, refined mean), then the store.
// As in the CPU kernel, the mean is kept as base + mu (TwoSum) and subtracted in two steps, so a
// large mean costs no precision. Here, apart from the launches in layer_norm_cuda.cu, so that
// bench/schedules_cuda.cu can time contiguous_kernel with other row schedules.
#pragma once

#include <cmath>

#include "opforge/cuda/panel_rows.cuh"

namespace opforge::layer_norm_cuda {

constexpr int kThreads = 256;  // for strided rows

// The schedule the op runs contiguous rows with: the row type (cuda/rows.cuh), its packs per thread
// and its loads and stores. bench/schedules_cuda.cu times other schedules beside this one (other
// packs and accesses, cuda/schedule_variants.cuh's rows); adopting one is changing this line.
template <typename T>
using OwnRow = cuda::CachedRow<T, cuda::kRowPacks, cuda::PlainAccess>;

template <typename T, class Row>
__device__ __forceinline__ void normalize(T* out, const Row& row, const T* first, const T* w, int64_t w_step,
                                          const T* b, int64_t b_step, int64_t n, double eps) {
  using A = cuda::Acc<T>;
  const A shift = cuda::load(first);  // x[0] of the row
  A sum = 0;
  row.each([&](int64_t, A v) { sum += v - shift; });
  const A approx = cuda::row_sum(row, sum) / A(n);
  const A base = shift + approx;  // TwoSum: base + mu == shift + approx exactly
  const A back = base - shift;
  A mu = (shift - (base - back)) + (approx - back);
  A ss = 0, c = 0;
  row.each([&](int64_t, A v) {
    const A d = (v - base) - mu;
    ss += d * d;
    c += d;
  });
  cuda::row_sum2(row, ss, c);
  const A correction = c / A(n);
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

// Rows side by side (cuda/panel_rows.cuh): a panel of them per block, one per warp. A warp past
// the panel's rows (which stores nothing) takes the panel's first row's x[0].
template <typename T>
__global__ void __launch_bounds__(cuda::PanelRow<T>::kThreads)
    panel_kernel(T* out, const T* x, cuda::Indexer rows_ix, int64_t step, cuda::Panels panels, const T* w,
                 int64_t w_step, const T* b, int64_t b_step, int64_t n, double eps) {
  for (int64_t p = blockIdx.x; p < panels.count; p += gridDim.x) {
    const int64_t first = panels.first(p);
    const int rows = panels.rows(p), warp = threadIdx.x / 32;
    const T* panel = x + rows_ix.offset(first);
    normalize(out + (first + warp) * n, cuda::PanelRow<T>{panel, step, n, rows}, panel + (warp < rows ? warp : 0), w,
              w_step, b, b_step, n, eps);
  }
}

// Contiguous aligned rows of type Row (OwnRow<T>, or a schedule bench/schedules_cuda.cu times),
// cuda::contiguous_row_threads<Row> threads per block.
template <typename T, class Row = OwnRow<T>>
__global__ void __launch_bounds__(cuda::kMaxRowThreads)
    contiguous_kernel(T* out, const T* x, const T* w, int64_t w_step, const T* b, int64_t b_step, int64_t rows,
                      int64_t n, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    normalize(out + r * n, Row(x + r * n, n), x + r * n, w, w_step, b, b_step, n, eps);
}

}  // namespace opforge::layer_norm_cuda
