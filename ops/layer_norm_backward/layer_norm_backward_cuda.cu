// layer_norm_backward on CUDA, on the caller's stream. Contiguous aligned rows (cuda/rows.cuh's
// CachedRow) in two launches:
//   fused:   one block per fixed chunk of rows; each row of grad and x read once into registers:
//            the moments as in the forward kernel (mean = base + mu), sums of g*w and
//            g*w*(x - mean), grad_x stored, and g*xhat and g added to the block's column sums
//            (registers, like the weight's packs) for grad_weight and grad_bias
//   combine: thread per column; adds the chunks' sums in chunk order
// Other layouts in three:
//   rows:    one block per row; the moments, the sums, then grad_x; base, mu and rstd kept
//   partial: thread per column per fixed chunk of rows; sums g*xhat and g down the chunk
//   combine: as above
// The fused path reads grad and x once where the three-launch one reads them three times.
// The path, the chunk count and every summation order depend on the shape and the layout only
// (not on the device or the run): grad_weight and grad_bias are bitwise repeatable. The
// per-row moments and the partials live in a stream-ordered workspace.
#include <cmath>

#include "opforge/cuda/rows.cuh"
#include "opforge/cuda/scratch.h"
#include "opforge/registry.h"

namespace opforge::layer_norm_backward_cuda {

constexpr int kThreads = 256;  // a multiple of 32
constexpr int64_t kMaxChunks = 64;
// Threads per block of the fused kernel, at most: its column sums and the weight's packs live in
// registers beside the two rows, which for the half types (8 elements a pack) needs more than a
// 512-thread block may have (ptxas spilled); 256 threads, rows of up to 8192 elements, do not.
template <typename T>
constexpr int kFusedThreads = sizeof(T) == 2 ? 256 : cuda::kMaxRowThreads;

template <typename A>
struct RowMoments {
  A mu, rstd, coef, offset;  // mean = base + mu; grad_x = rstd * (g*w - xhat * coef) + offset
};

// A row's moments and grad_x's coefficients from every thread's partial sums (ss and d_sum of
// d = (x - base) - mu; gw_sum and dot of g*w and g*w*d, with_gx only), the same in every thread:
// one definition for both kernels, so a masked call (no grad_x) computes the moments exactly as
// the full call does.
template <typename A>
__device__ __forceinline__ RowMoments<A> row_moments(A ss, A d_sum, A gw_sum, A dot, A mu, int64_t n, double eps,
                                                     bool with_gx) {
  cuda::block_sum2(ss, d_sum);
  const A correction = d_sum / A(n);
  if (with_gx) {
    cuda::block_sum2(gw_sum, dot);
    dot -= correction * gw_sum;
  }
  const A var = fmax(ss / A(n) - correction * correction, A(0));
  const A rstd = A(1) / sqrt(var + A(eps));
  return {mu + correction, rstd, rstd * dot / A(n), -rstd * gw_sum / A(n)};
}

// Rows [rows * c / chunks, rows * (c + 1) / chunks) for block c; grad_x where gx, this chunk's
// column sums of g*xhat and g into partial_w / partial_b [c * n ...] where partial_w.
template <typename T>
__global__ void __launch_bounds__(kFusedThreads<T>)
    fused_kernel(T* gx, cuda::Acc<T>* partial_w, cuda::Acc<T>* partial_b, const T* g, const T* x, const T* w,
                 int64_t rows, int64_t n, int64_t chunks, double eps) {
  using A = cuda::Acc<T>;
  using Row = cuda::CachedRow<T>;
  constexpr int kSize = cuda::Pack<T>::kSize;
  const int64_t c = blockIdx.x;
  A acc_w[cuda::kRowPacks][kSize] = {}, acc_b[cuda::kRowPacks][kSize] = {};
  const Row wr(w, n);
  for (int64_t r = rows * c / chunks; r < rows * (c + 1) / chunks; ++r) {
    const Row xr(x + r * n, n), gr(g + r * n, n);
    const A shift = cuda::load(x + r * n);
    A sum = 0;
    xr.each_zip([&](int, int, A xv) { sum += xv - shift; });
    const A approx = cuda::block_sum(sum) / A(n);
    const A base = shift + approx;  // TwoSum: base + mu == shift + approx exactly
    const A back = base - shift;
    A mu = (shift - (base - back)) + (approx - back);
    A ss = 0, d_sum = 0, gw_sum = 0, dot = 0;
    xr.each_zip([&](int, int, A xv, A gv, A wv) {
      const A d = (xv - base) - mu;
      ss += d * d;
      d_sum += d;
      if (gx) {
        gw_sum += gv * wv;
        dot += gv * wv * d;
      }
    }, gr, wr);
    const RowMoments<A> m = row_moments(ss, d_sum, gw_sum, dot, mu, n, eps, gx != nullptr);
    mu = m.mu;
    const A rstd = m.rstd;
    if (gx)
      gr.store_zip(gx + r * n, [&](int, int, A gv, A xv, A wv) {
        return rstd * (gv * wv - ((xv - base) - mu) * rstd * m.coef) + m.offset;
      }, xr, wr);
    if (partial_w)
      gr.each_zip([&](int k, int e, A gv, A xv) {
        acc_w[k][e] += gv * (((xv - base) - mu) * rstd);
        acc_b[k][e] += gv;
      }, xr);
  }
  if (partial_w)
    wr.for_packs([&](int k, int64_t j) {
#pragma unroll
      for (int e = 0; e < kSize; ++e) {
        partial_w[c * n + j * kSize + e] = acc_w[k][e];
        partial_b[c * n + j * kSize + e] = acc_b[k][e];
      }
    });
}

template <typename T>
__global__ void rows_kernel(T* gx, cuda::Acc<T>* moments, const T* g, cuda::Indexer g_rows, int64_t g_step,
                            const T* x, cuda::Indexer x_rows, int64_t x_step, const T* w, int64_t w_step,
                            int64_t rows, int64_t n, double eps) {
  using A = cuda::Acc<T>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* grow = g + g_rows.offset(r);
    const T* xrow = x + x_rows.offset(r);
    const A shift = cuda::load(xrow);
    A sum = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += cuda::load(xrow + i * x_step) - shift;
    const A approx = cuda::block_sum(sum) / A(n);
    const A base = shift + approx;  // TwoSum: base + mu == shift + approx exactly
    const A back = base - shift;
    A mu = (shift - (base - back)) + (approx - back);
    A ss = 0, c = 0, gw_sum = 0, dot = 0;
    // Without grad_x (uniform across the grid) the partials need the moments only: no grad or
    // weight reads, no g*w sums.
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const A d = (cuda::load(xrow + i * x_step) - base) - mu;
      ss += d * d;
      c += d;
      if (gx) {
        const A gw = cuda::load(grow + i * g_step) * cuda::load(w + i * w_step);
        gw_sum += gw;
        dot += gw * d;
      }
    }
    const RowMoments<A> m = row_moments(ss, c, gw_sum, dot, mu, n, eps, gx != nullptr);
    mu = m.mu;
    const A rstd = m.rstd, coef = m.coef, offset = m.offset;
    if (threadIdx.x == 0) {
      moments[3 * r] = base;
      moments[3 * r + 1] = mu;
      moments[3 * r + 2] = rstd;
    }
    if (!gx) continue;  // grad_x not asked for: the moments are all the partials need
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const A xhat = ((cuda::load(xrow + i * x_step) - base) - mu) * rstd;
      const A gw = cuda::load(grow + i * g_step) * cuda::load(w + i * w_step);
      cuda::store(gx + r * n + i, rstd * (gw - xhat * coef) + offset);
    }
  }
}

template <typename T>
__global__ void partial_kernel(cuda::Acc<T>* partial_w, cuda::Acc<T>* partial_b, const cuda::Acc<T>* moments,
                               const T* g, cuda::Indexer g_rows, int64_t g_step, const T* x, cuda::Indexer x_rows,
                               int64_t x_step, int64_t rows, int64_t n, int64_t chunks) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t k = blockIdx.y;
  if (i >= n) return;
  cuda::Acc<T> sw = 0, sb = 0;
  for (int64_t r = rows * k / chunks; r < rows * (k + 1) / chunks; ++r) {
    const cuda::Acc<T> gi = cuda::load(g + g_rows.offset(r) + i * g_step);
    const cuda::Acc<T>* m = moments + 3 * r;
    sw += gi * ((cuda::load(x + x_rows.offset(r) + i * x_step) - m[0]) - m[1]) * m[2];
    sb += gi;
  }
  partial_w[k * n + i] = sw;
  partial_b[k * n + i] = sb;
}

template <typename T>
__global__ void combine_kernel(T* gw, T* gb, const cuda::Acc<T>* partial_w, const cuda::Acc<T>* partial_b,
                               int64_t n, int64_t chunks) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if (gw) cuda::store(gw + i, cuda::column_sum(partial_w, i, n, chunks));  // either may not be asked for
    if (gb) cuda::store(gb + i, cuda::column_sum(partial_b, i, n, chunks));
  }
}

cuda::Indexer rows_of(const TensorView& t) {
  Dims outer(t.shape.begin(), t.shape.end() - 1);
  Dims outer_strides(t.strides.begin(), t.strides.end() - 1);
  return cuda::make_indexer("layer_norm_backward", outer, outer_strides);
}

void run(const KernelCall& call) {
  const char* op = "layer_norm_backward";
  const TensorView& g = call.tensor("grad");
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("weight");
  const TensorView& gx = call.output(0);
  const TensorView& gw = call.output(1);
  const TensorView& gb = call.output(2);
  cudaStream_t stream = cuda::stream_of(call);
  const int64_t n = x.size(-1);
  if (n == 0) return;
  const int64_t rows = x.numel() / n;
  if (rows == 0) {  // no rows: grad_weight and grad_bias are empty sums
    if (gw.nbytes()) cuda::check_cuda(op, cudaMemsetAsync(gw.data, 0, gw.nbytes(), stream), "cudaMemsetAsync");
    if (gb.nbytes()) cuda::check_cuda(op, cudaMemsetAsync(gb.data, 0, gb.nbytes(), stream), "cudaMemsetAsync");
    return;
  }
  const auto g_rows = rows_of(g), x_rows = rows_of(x);
  const int64_t chunks = rows < kMaxChunks ? rows : kMaxChunks;
  cuda::visit(g.dtype, "layer_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      fail(ErrorKind::not_implemented, "layer_norm_backward(): no integer kernel");
    } else {
      using A = cuda::Acc<T>;
      const int threads = cuda::cached_row_threads(x, g, sizeof(T), {&w});
      if (threads && threads <= kFusedThreads<T> && (!gx.numel() || cuda::aligned16(gx.data))) {
        const int64_t fused_chunks = cuda::row_chunks(rows, threads);
        const bool sums = gw.numel() || gb.numel();
        const cuda::Scratch partials(call, sums ? sizeof(A) * 2 * fused_chunks * n : 0);
        A* partial_w = partials.as<A>();
        A* partial_b = sums ? partial_w + fused_chunks * n : nullptr;
        fused_kernel<T><<<unsigned(fused_chunks), threads, 0, stream>>>(
            gx.numel() ? gx.data_as<T>() : nullptr, partial_w, partial_b, g.data_as<const T>(), x.data_as<const T>(),
            w.data_as<const T>(), rows, n, fused_chunks, call.attr_float("eps"));
        if (sums)
          combine_kernel<T><<<cuda::blocks_for(n, kThreads), kThreads, 0, stream>>>(
              gw.numel() ? gw.data_as<T>() : nullptr, gb.numel() ? gb.data_as<T>() : nullptr, partial_w, partial_b, n,
              fused_chunks);
        return cuda::check_launch(op);
      }
      const cuda::Scratch workspace(call, sizeof(A) * (3 * rows + 2 * chunks * n));
      A* moments = workspace.as<A>();
      A* partial_w = moments + 3 * rows;
      A* partial_b = partial_w + chunks * n;
      // Results not asked for (output_mask) are empty: no grad_x stores, or no partial sums.
      rows_kernel<T><<<cuda::row_blocks(rows), kThreads, 0, stream>>>(
          gx.numel() ? gx.data_as<T>() : nullptr, moments, g.data_as<const T>(), g_rows, g.stride(-1),
          x.data_as<const T>(), x_rows,
          x.stride(-1), w.data_as<const T>(), w.stride(0), rows, n, call.attr_float("eps"));
      if (gw.numel() || gb.numel()) {
        const dim3 grid(static_cast<unsigned>((n + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
        partial_kernel<T><<<grid, kThreads, 0, stream>>>(partial_w, partial_b, moments, g.data_as<const T>(), g_rows,
                                                         g.stride(-1), x.data_as<const T>(), x_rows, x.stride(-1),
                                                         rows, n, chunks);
        combine_kernel<T><<<cuda::blocks_for(n, kThreads), kThreads, 0, stream>>>(
            gw.numel() ? gw.data_as<T>() : nullptr, gb.numel() ? gb.data_as<T>() : nullptr, partial_w, partial_b, n,
            chunks);
      }
      cuda::check_launch(op);
    }
  });
}

OPFORGE_KERNEL(layer_norm_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::layer_norm_backward_cuda
