// linear_act_backward on CUDA (backward_as<T>; linear_act_backward_cuda.cu dispatches by dtype):
// g = grad * act'(z) into a workspace in the accumulation type (float for the half types), then
// two products: grad_x = g @ weight and grad_weight = g^T @ x.
// z is preact (saved by linear_act_with_preact: g is one elementwise kernel) or, without it,
// recomputed by a third product; act='none' needs no z. The products run through cuBLASLt where
// it loads and takes the layout (a half type's float g as two T parts, hi + lo, so g keeps
// about float's precision where rounding it to T would not), else the tiled kernel of
// ops/linear_act/gemm.cuh (the recomputing one forms g in its epilogue). grad_bias sums g's
// columns in an order fixed by the shapes (deterministic).
#pragma once

#include <type_traits>

#include "opforge/cuda/blaslt.h"
#include "opforge/cuda/sum_to_shape.cuh"
#include "ops/linear_act/gemm.cuh"

namespace opforge::linear_act_backward_cuda {
using namespace linear_act_cuda;

template <typename T, class ActGrad>
struct GradAct {
  cuda::Acc<T>* g;
  int64_t n;
  const T* grad;
  cuda::Indexer grad_rows;
  int64_t grad_stride;
  const T* bias;
  int64_t bias_stride;
  ActGrad act_grad;
  __device__ void operator()(int64_t a, int64_t b, cuda::Acc<T> z) const {
    if (bias) z += cuda::load(bias + b * bias_stride);
    g[a * n + b] = act_grad(cuda::load(grad + grad_rows.offset(a) + b * grad_stride), z);
  }
};

// g[a, b] = grad[a, b] * act'(z[a, b] + bias[b]) (bias may be nullptr); rows through each
// operand's Indexer. z is the saved preact (T) or cuBLASLt's product in g's own buffer (Z = the
// accumulation type: each element read before it is written, by one thread).
template <typename T, typename Z, class ActGrad>
__global__ void grad_from_preact(cuda::Acc<T>* g, int64_t m, int64_t n, const T* grad, cuda::Indexer grad_rows,
                                 int64_t grad_stride, const Z* z, cuda::Indexer z_rows, int64_t z_stride,
                                 const T* bias, int64_t bias_stride, ActGrad act_grad) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < m * n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t a = e / n, b = e % n;
    cuda::Acc<T> v = cuda::load(z + z_rows.offset(a) + b * z_stride);
    if (bias) v += cuda::load(bias + b * bias_stride);
    g[e] = act_grad(cuda::load(grad + grad_rows.offset(a) + b * grad_stride), v);
  }
}

// What the half-type parts hold of g: float16 tops out at 65504, and g = grad * act'(z) reaches
// 1.13 times grad (gelu's and silu's steepest slopes), so its parts hold g / 2 and the products
// scale by 2 (powers of two: exact). bfloat16 has float's range.
template <typename T>
inline constexpr float kPartScale = std::is_same_v<T, __half> ? 0.5f : 1.f;

// hi[e] + lo[e] == g[e] * kPartScale to about twice T's precision (hi rounded to T, lo the rest
// rounded; lo 0 where hi is infinite, as an infinite g's product is): cuBLASLt's products take
// operands of one type, so a half type's float g goes in as two.
template <typename T>
__global__ void split_kernel(T* hi, T* lo, const float* g, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const float v = g[e] * kPartScale<T>;
    const T h = static_cast<T>(v);
    hi[e] = h;
    lo[e] = static_cast<T>(isinf(static_cast<float>(h)) ? 0.f : v - static_cast<float>(h));
  }
}

// out [rows, cols] = sum_p G(r, p) B(c, p) through cuBLASLt, G one of g's two views (g_view's
// strides): g itself where it has T's type; for a half type lo's product first, then hi's added
// to it (beta = 1), each scaled back by 1 / kPartScale. false where
// cuBLASLt declines; the caller's tiled kernel then writes all of out.
template <typename T>
bool product_by_blaslt(const char* op, DType dtype, int64_t rows, int64_t cols, int64_t depth, const void* g,
                       const T* hi, const T* lo, cuda::blaslt::Operand g_view, cuda::blaslt::Operand b, void* out,
                       const KernelCall& call) {
  const cudaStream_t stream = cuda::stream_of(call);
  if (std::is_same_v<cuda::Acc<T>, T>) {
    g_view.data = g;
    return cuda::blaslt::matmul(op, dtype, rows, cols, depth, g_view, b, nullptr, out, dtype, stream, call.scratch());
  }
  cuda::blaslt::Operand lo_view = g_view, hi_view = g_view;
  lo_view.data = lo;
  hi_view.data = hi;
  constexpr double unscale = 1.0 / kPartScale<T>;
  return cuda::blaslt::matmul(op, dtype, rows, cols, depth, lo_view, b, nullptr, out, dtype, stream, call.scratch(),
                              false, unscale) &&
         cuda::blaslt::matmul(op, dtype, rows, cols, depth, hi_view, b, nullptr, out, dtype, stream, call.scratch(),
                              true, unscale);
}

// linear_act_backward for x's dtype T. Its instantiations are the heaviest CUDA compiles here, one
// dtype per file (linear_act_backward_cuda.cu: float; linear_act_backward_cuda_<dtype>.cu: the
// others), so they build in parallel.
template <typename T>
void backward_as(const KernelCall& call) {
  const char* op = "linear_act_backward";
  const TensorView& grad = call.tensor("grad");
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("weight");
  const TensorView* bias = call.optional_tensor("bias");
  const TensorView* preact = call.optional_tensor("preact");
  const int64_t k = x.size(-1), n = w.size(0), m = grad.numel() / (n ? n : 1);
  cudaStream_t stream = cuda::stream_of(call);
  const Dims lead(x.shape.begin(), x.shape.end() - 1);
  const cuda::Indexer x_rows = cuda::make_indexer(op, lead, {x.strides.begin(), x.strides.end() - 1});
  const cuda::Indexer g_rows = cuda::make_indexer(op, lead, {grad.strides.begin(), grad.strides.end() - 1});
  for (int i = 0; i < 3; ++i) {  // empty sums (no rows, or n == 0) are zeros
    const TensorView& out = call.output(i);
    if (out.nbytes()) cuda::check_cuda(op, cudaMemsetAsync(out.data, 0, out.nbytes(), stream), "cudaMemsetAsync");
  }
  if (m == 0 || n == 0) return;
  using A = cuda::Acc<T>;
  constexpr bool half = !std::is_same_v<A, T>;
  // g, then for a half type with cuBLASLt its two parts (hi, lo), in one workspace.
  // x's rows one stride apart, and cuBLASLt loaded: it may take the products (else no half-type
  // parts are made for it).
  const bool by_blaslt = x_rows.rank <= 1 && cuda::blaslt::ready();
  const int64_t parts = half && by_blaslt ? 2 : 0;
  const cuda::Scratch workspace(call, (sizeof(A) + parts * sizeof(T)) * m * n);
  A* g = workspace.as<A>();
  T* hi = parts ? reinterpret_cast<T*>(g + m * n) : nullptr;
  T* lo = parts ? hi + m * n : nullptr;
  const cuda::Indexer x_cols = cuda::make_indexer(op, {k}, {x.stride(-1)});
  const Mat<T> xa{x.data_as<const T>(), x_rows, x_cols};
  const int64_t x_row_stride = row_stride(x_rows, k);
  const T* bias_data = bias ? bias->data_as<const T>() : nullptr;
  const int64_t bias_stride = bias ? bias->stride(0) : 0;
  const cuda::Indexer g_plain = cuda::make_indexer(op, {m}, {n});
  visit_act(call.attr_str("act"), [&](auto, auto act_grad) {
    // act='none' needs no z (g = grad; IdentityGrad ignores the grad passed as z).
    constexpr bool identity = std::is_same_v<decltype(act_grad), IdentityGrad>;
    if (preact || identity) {
      const TensorView& z = identity ? grad : *preact;
      const cuda::Indexer z_rows = cuda::make_indexer(op, lead, {z.strides.begin(), z.strides.end() - 1});
      grad_from_preact<T><<<cuda::blocks_for(m * n, 256), 256, 0, stream>>>(
          g, m, n, grad.data_as<const T>(), g_rows, grad.stride(-1), z.data_as<const T>(), z_rows, z.stride(-1),
          static_cast<const T*>(nullptr), 0, act_grad);
      return cuda::check_launch(op);
    }
    // z = x @ weight^T by cuBLASLt, in the accumulation type, into g's buffer; then g =
    // grad * act'(z + bias) in place. Else one tiled product whose epilogue forms g.
    if (by_blaslt && cuda::blaslt::matmul(op, x.dtype, m, n, k, {x.data, x_row_stride, x.stride(-1)},
                                          {w.data, w.stride(0), w.stride(1)}, nullptr, g,
                                          half ? DType::float32 : x.dtype, stream, call.scratch())) {
      grad_from_preact<T><<<cuda::blocks_for(m * n, 256), 256, 0, stream>>>(
          g, m, n, grad.data_as<const T>(), g_rows, grad.stride(-1), static_cast<const A*>(g), g_plain, 1,
          bias_data, bias_stride, act_grad);
      return cuda::check_launch(op);
    }
    const GradAct<T, decltype(act_grad)> epi{g, n, grad.data_as<const T>(), g_rows, grad.stride(-1), bias_data,
                                             bias_stride, act_grad};
    gemm<A>(op, m, n, k, xa, matrix(op, w.data_as<const T>(), n, w.stride(0), k, w.stride(1)), epi, stream);
  });
  if constexpr (half) {
    if (parts) {
      split_kernel<T><<<cuda::blocks_for(m * n, 256), 256, 0, stream>>>(hi, lo, g, m * n);
      cuda::check_launch(op);
    }
  }
  // Only the results asked for (output_mask; the others are empty, k == 0 makes both empty).
  // grad_x[a, b] = sum_p g[a, p] weight[p, b]; grad_weight[a, b] = sum_p g[p, a] x[p, b].
  if (call.output(0).numel() &&
      !(by_blaslt && product_by_blaslt<T>(op, x.dtype, m, k, n, g, hi, lo, {nullptr, n, 1},
                                          {w.data, w.stride(1), w.stride(0)}, call.output(0).data, call))) {
    const BiasAct<T, Identity> gx{call.output(0).data_as<T>(), k, nullptr, 0, Identity{}};
    const Mat<T> w_t = matrix(op, w.data_as<const T>(), k, w.stride(1), n, w.stride(0));
    gemm<A>(op, m, k, n, matrix<A>(op, g, m, n, n, 1), w_t, gx, stream);
  }
  if (call.output(1).numel() &&
      !(by_blaslt && product_by_blaslt<T>(op, x.dtype, n, k, m, g, hi, lo, {nullptr, 1, n},
                                          {x.data, x.stride(-1), x_row_stride}, call.output(1).data, call))) {
    const BiasAct<T, Identity> gw{call.output(1).data_as<T>(), k, nullptr, 0, Identity{}};
    gemm<A>(op, n, k, m, matrix<A>(op, g, n, 1, m, n), Mat<T>{x.data_as<const T>(), x_cols, x_rows}, gw, stream);
  }
  // grad_bias: g's columns summed (opforge/cuda/sum_to_shape.cuh: chunks of rows, then in order).
  if (call.output(2).numel()) {
    const cuda::GradTerms<A> columns{g, cuda::make_indexer(op, {n}, {1}), cuda::make_indexer(op, {m}, {n})};
    cuda::sum_to_shape(call, call.output(2).data_as<T>(), columns, n, m, /*inner_kept=*/true);
  }
}

extern template void backward_as<float>(const KernelCall&);
extern template void backward_as<double>(const KernelCall&);
extern template void backward_as<__half>(const KernelCall&);
extern template void backward_as<__nv_bfloat16>(const KernelCall&);

}  // namespace opforge::linear_act_backward_cuda
