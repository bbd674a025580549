// Activation functions and their derivatives for CUDA kernels, in the accumulation type
// (float for the half types), plus launchers for the elementwise ops built from them. The
// same guards as the CPU versions (cpu/activation-inl.h): exponentials see -|x| only, and x is
// clamped where it multiplies a vanishing factor, so +-inf give the limits and NaN stays NaN.
#pragma once

#include <type_traits>

#include "opforge/cuda/common.cuh"

namespace opforge::cuda {

template <typename A> __device__ __forceinline__ A exp_of(A x) {
  if constexpr (std::is_same_v<A, float>) return expf(x); else return exp(x);
}
// Phi(x) = erfc(-x / sqrt(2)) / 2 in float, as the CPU kernels compute it (cpu/activation-inl.h,
// NormalCdfAnyX): erfc(|z|) by Numerical Recipes' erfcc (a Chebyshev fit, relative error below
// 1.2e-7 on all of [0, inf), so the far left tail keeps its relative accuracy) in h = 1 / (2 + z)
// with the coefficients scaled by powers of 2 (exact), -z^2 as one FMA. About 35 instructions where
// CUDA's normcdff takes about 70 (PTX for sm_90): with normcdff, gelu was bound by arithmetic at 79%
// of the H200's copy bandwidth (4.17 TB/s, float32). NaN gives NaN (fminf drops it; expf keeps it).
__device__ __forceinline__ float normal_cdf(float x) {
  const float h = __frcp_rn(fmaf(fminf(fabsf(x), 64.0f), 0.70710678118654752f, 2.0f));
  const float h2 = h * h, h4 = h2 * h2;
  const auto pair = [h](float c0, float c1) { return fmaf(h, c1, c0); };
  const float low = fmaf(h2, pair(0.37409196f * 4, 0.09678418f * 8), pair(-1.26551223f, 1.00002368f * 2));
  const float mid = fmaf(h2, pair(-1.13520398f * 64, 1.48851587f * 128), pair(-0.18628806f * 16, 0.27886807f * 32));
  const float p = fmaf(h4, fmaf(h4, pair(-0.82215223f * 256, 0.17087277f * 512), mid), low);
  const float half_erfc = h * expf(fmaf(-0.5f * x, x, p));
  return x < 0.0f ? half_erfc : 1.0f - half_erfc;
}
template <typename A> __device__ __forceinline__ A normcdf_of(A x) {
  if constexpr (std::is_same_v<A, float>) return normal_cdf(x); else return normcdf(x);
}
template <typename A> __device__ __forceinline__ A clamp_below(A x, A limit) { return x < -limit ? -limit : x; }
template <typename A> __device__ __forceinline__ A clamp_abs(A x, A limit) {
  return x > limit ? limit : (x < -limit ? -limit : x);
}

// sigmoid(x) and sigmoid(-x), each without cancellation.
template <typename A> __device__ __forceinline__ void sigmoid_pair(A x, A& s, A& s_neg) {
  const A e = exp_of(-(x < A(0) ? -x : x));
  const A r = A(1) / (A(1) + e), q = e * r;
  s = x >= A(0) ? r : q;
  s_neg = x >= A(0) ? q : r;
}

constexpr double kSiluLimit = 1000.0;
constexpr double kGeluLimit = 40.0;

struct Relu {
  template <typename A> __device__ A operator()(A x) const { return x <= A(0) ? A(0) : x; }
};
struct ReluGrad {
  template <typename A> __device__ A operator()(A g, A x) const { return x <= A(0) ? A(0) : g; }
};
struct Silu {
  template <typename A> __device__ A operator()(A x) const {
    const A xl = clamp_below(x, A(kSiluLimit));
    A s, s_neg;
    sigmoid_pair(xl, s, s_neg);
    return xl * s;
  }
};
struct SiluGrad {
  template <typename A> __device__ A operator()(A g, A x) const {
    const A xc = clamp_abs(x, A(kSiluLimit));
    A s, s_neg;
    sigmoid_pair(xc, s, s_neg);
    return g * (s * (A(1) + xc * s_neg));
  }
};
struct GeluErf {
  template <typename A> __device__ A operator()(A x) const {
    const A xl = clamp_below(x, A(kGeluLimit));
    return xl * normcdf_of(xl);
  }
};
struct GeluErfGrad {
  template <typename A> __device__ A operator()(A g, A x) const {
    const A xc = clamp_abs(x, A(kGeluLimit));
    return g * (normcdf_of(xc) + xc * exp_of(A(-0.5) * xc * xc) * A(0.39894228040143267794));
  }
};
// 0.5 x (1 + tanh(u)) = x sigmoid(2u), 2u = x (k0 + k1 x^2).
template <typename A> __device__ __forceinline__ A gelu_tanh_arg(A x) {
  return x * (A(1.59576912160573071176) + A(1.59576912160573071176 * 0.044715) * x * x);
}
struct GeluTanh {
  template <typename A> __device__ A operator()(A x) const {
    const A xl = clamp_below(x, A(kGeluLimit));
    A s, s_neg;
    sigmoid_pair(gelu_tanh_arg(xl), s, s_neg);
    return xl * s;
  }
};
struct GeluTanhGrad {
  template <typename A> __device__ A operator()(A g, A x) const {
    const A xc = clamp_abs(x, A(kGeluLimit));
    const A slope = A(1.59576912160573071176) + A(3 * 1.59576912160573071176 * 0.044715) * xc * xc;
    A s, s_neg;
    sigmoid_pair(gelu_tanh_arg(xc), s, s_neg);
    return g * (s * (A(1) + xc * s_neg * slope));
  }
};

template <typename T, class F>
__global__ void unary_kernel(T* out, const T* x, Indexer ix, bool contiguous, int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store(out + i, f(load(x + (contiguous ? i : ix.offset(i)))));
}

template <typename T, class F>
__global__ void binary_kernel(T* out, const T* a, Indexer ia, const T* b, Indexer ib, int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store(out + i, f(load(a + ia.offset(i)), load(b + ib.offset(i))));
}

// Calls f(T{}) for the float dtypes only (activations have no integer form).
template <typename F>
void visit_float(DType dtype, const char* op, F&& f) {
  visit(dtype, op, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<Acc<T>>) f(tag);
    else fail(ErrorKind::not_implemented, op, "(): cuda kernel has no ", dtype_name(dtype), " variant");
  });
}

// out = f(x), for an op whose tensor argument is "x".
template <class F>
void launch_unary(const KernelCall& call, const char* op, F f) {
  const TensorView& x = call.tensor("x");
  const TensorView& out = call.output();
  const Indexer ix = make_indexer(op, x.shape, x.strides);
  visit_float(x.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    if (try_map_contiguous<T, 1>(out, {&x}, f, stream_of(call))) return;
    const int threads = 256;
    unary_kernel<T><<<blocks_for(out.numel(), threads), threads, 0, stream_of(call)>>>(
        out.data_as<T>(), x.data_as<const T>(), ix, x.is_contiguous(), out.numel(), f);
  });
  check_launch(op);
}

// out = f(grad, x), grad and x (the argument named `x_arg`) broadcast against each other.
template <class F>
void launch_grad(const KernelCall& call, const char* op, F f, const char* x_arg = "x") {
  const TensorView& grad = call.tensor("grad");
  const TensorView& x = call.tensor(x_arg);
  const TensorView& out = call.output();
  const Indexer ig = make_indexer(op, out.shape, broadcast_strides(grad, out.shape));
  const Indexer ix = make_indexer(op, out.shape, broadcast_strides(x, out.shape));
  visit_float(grad.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    if (try_map_contiguous<T, 2>(out, {&grad, &x}, f, stream_of(call))) return;
    const int threads = 256;
    binary_kernel<T><<<blocks_for(out.numel(), threads), threads, 0, stream_of(call)>>>(
        out.data_as<T>(), grad.data_as<const T>(), ig, x.data_as<const T>(), ix, out.numel(), f);
  });
  check_launch(op);
}

}  // namespace opforge::cuda
