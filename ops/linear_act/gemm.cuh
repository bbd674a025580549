// linear_act's CUDA matrix product: D[a, b] = sum_p A(a, p) B(b, p), a 64 x 64 tile per block of
// 256 threads (4 x 4 results each), K in steps of 16 through shared memory, accumulating in
// float (double for float64); each result goes straight to an epilogue functor (bias,
// activation, rounding), so nothing is written twice. Operand rows may sit anywhere (an Indexer
// over x's leading dims, on either side); their offsets go through shared memory once per block
// (rows) and per K step (columns).
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "opforge/cuda/activation.cuh"
#include "opforge/kernel.h"
#include "ops/linear_act/blaslt.cuh"
#include "ops/linear_act/sgemm_nt.cuh"

namespace opforge::linear_act_cuda {

constexpr int kTile = 64, kStep = 16, kThreads = 256;

// Element (r, p) at data[rows.offset(r) + cols.offset(p)]: x's leading dims may be any layout.
template <typename T>
struct Mat {
  const T* data;
  cuda::Indexer rows, cols;
};

// A plain strided matrix, element (r, p) at data[r * rs + p * ps].
template <typename T>
inline Mat<T> matrix(const char* op, const T* data, int64_t rows, int64_t rs, int64_t cols, int64_t ps) {
  return {data, cuda::make_indexer(op, {rows}, {rs}), cuda::make_indexer(op, {cols}, {ps})};
}

struct Identity {
  template <typename A> __device__ A operator()(A x) const { return x; }
};
struct IdentityGrad {
  template <typename A> __device__ A operator()(A g, A) const { return g; }
};

// Calls f(forward functor, gradient functor) for the `act` attribute (validated by the shape rule).
template <class F>
void visit_act(const std::string& act, F&& f) {
  if (act == "relu") f(cuda::Relu{}, cuda::ReluGrad{});
  else if (act == "gelu") f(cuda::GeluErf{}, cuda::GeluErfGrad{});
  else if (act == "gelu_tanh") f(cuda::GeluTanh{}, cuda::GeluTanhGrad{});
  else if (act == "silu") f(cuda::Silu{}, cuda::SiluGrad{});
  else f(Identity{}, IdentityGrad{});
}

template <typename A, typename TA, typename TB, class Epi>
__global__ void __launch_bounds__(kThreads) gemm_kernel(int64_t M, int64_t N, int64_t K, Mat<TA> a, Mat<TB> b,
                                                        Epi epi) {
  __shared__ A as[kStep][kTile + 1], bs[kStep][kTile + 1];
  __shared__ int64_t a_off[kTile], b_off[kTile], a_p[kStep], b_p[kStep];
  const int64_t b0 = int64_t(blockIdx.x) * kTile;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  // Row tiles in a grid-stride loop: gridDim.y is capped at 65535.
  for (int64_t a0 = int64_t(blockIdx.y) * kTile; a0 < M; a0 += int64_t(gridDim.y) * kTile) {
    if (tid < kTile) {
      a_off[tid] = a0 + tid < M ? a.rows.offset(a0 + tid) : 0;
    } else if (tid < 2 * kTile) {
      const int r = tid - kTile;
      b_off[r] = b0 + r < N ? b.rows.offset(b0 + r) : 0;
    }
    A acc[4][4] = {};
    for (int64_t p0 = 0; p0 < K; p0 += kStep) {
      if (tid < kStep) a_p[tid] = p0 + tid < K ? a.cols.offset(p0 + tid) : 0;
      else if (tid < 2 * kStep) b_p[tid - kStep] = p0 + tid - kStep < K ? b.cols.offset(p0 + tid - kStep) : 0;
      __syncthreads();
      // 64 x 16 elements per operand, 4 per thread; p fastest so row-major operands read in runs.
      for (int e = tid; e < kTile * kStep; e += kThreads) {
        const int r = e / kStep, p = e % kStep;
        const bool in_k = p0 + p < K;
        as[p][r] = (in_k && a0 + r < M) ? cuda::load(a.data + a_off[r] + a_p[p]) : A(0);
        bs[p][r] = (in_k && b0 + r < N) ? cuda::load(b.data + b_off[r] + b_p[p]) : A(0);
      }
      __syncthreads();
#pragma unroll
      for (int p = 0; p < kStep; ++p) {
        A av[4], bv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          av[i] = as[p][ty + 16 * i];
          bv[i] = bs[p][tx + 16 * i];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t r = a0 + ty + 16 * i, c = b0 + tx + 16 * j;
        if (r < M && c < N) epi(r, c, acc[i][j]);
      }
    __syncthreads();  // a_off is rewritten for the next row tile
  }
}

// D through `epi` on `stream`; M, N > 0.
template <typename A, typename TA, typename TB, class Epi>
void gemm(const char* op, int64_t M, int64_t N, int64_t K, const Mat<TA>& a, const Mat<TB>& b, Epi epi,
          cudaStream_t stream) {
  const int64_t grid_x = (N + kTile - 1) / kTile, grid_y = (M + kTile - 1) / kTile;
  const dim3 grid(unsigned(grid_x), cuda::grid_blocks(grid_y, 65535));
  gemm_kernel<A><<<grid, kThreads, 0, stream>>>(M, N, K, a, b, epi);
  cuda::check_launch(op);
}

// out[a, b] = act(D + bias[b]), rounded to T; with preact (out's layout), D + bias[b] there too.
template <typename T, class Act>
struct BiasAct {
  T* out;
  int64_t ldo;
  const T* bias;  // nullptr: none
  int64_t bias_stride;
  Act act;
  T* preact = nullptr;  // nullptr: not wanted
  __device__ void operator()(int64_t a, int64_t b, cuda::Acc<T> v) const {
    if (bias) v += cuda::load(bias + b * bias_stride);
    if (preact) cuda::store(preact + a * ldo + b, v);
    cuda::store(out + a * ldo + b, act(v));
  }
};

// linear_act's forward on call's stream (linear_act and linear_act_with_preact): out =
// act(x @ weight^T + bias) into output 0, and with save_preact the sum before act into output 1.
// cuBLASLt where it takes the case (blaslt.cuh), else opforge's own kernels. Defined in
// linear_act_cuda.cu; linear_act_with_preact's kernel calls it too (one compile for both ops).
void forward(const KernelCall& call, const char* op, bool save_preact);

// forward for x's dtype T. Its instantiations are the heaviest CUDA compiles here, one dtype per
// file (linear_act_cuda.cu: float; linear_act_cuda_<dtype>.cu: the others), so they build in
// parallel.
template <typename T>
void forward_as(const KernelCall& call, const char* op, bool save_preact) {
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("weight");
  const TensorView* bias = call.optional_tensor("bias");
  const TensorView& out = call.output(0);
  const int64_t k = x.size(-1), n = w.size(0), m = out.numel() / n;
  const Dims lead(x.shape.begin(), x.shape.end() - 1);
  const Dims lead_strides(x.strides.begin(), x.strides.end() - 1);
  const Mat<T> a{x.data_as<const T>(), cuda::make_indexer(op, lead, lead_strides),
                 cuda::make_indexer(op, {k}, {x.stride(-1)})};
  const Mat<T> b = matrix(op, w.data_as<const T>(), n, w.stride(0), k, w.stride(1));
  // x's rows one stride apart (its leading dims merge to one, or there is one row) and both
  // operands contiguous along k: the 128 x 128 float32 kernel (sgemm_nt.cuh) where it fits.
  const int64_t lda = row_stride(a.rows, k);
  const bool nt = std::is_same_v<T, float> && a.rows.rank <= 1 && x.stride(-1) == 1 && w.stride(1) == 1 &&
                  sgemm_nt_fits(x.data, lda, w.data, w.stride(0), m, k);
  const std::string& act_name = call.attr_str("act");
  T* preact = save_preact ? call.output(1).data_as<T>() : nullptr;
  visit_act(act_name, [&](auto act, auto) {
    if (forward_blaslt<T>(op, act_name, act, x, a.rows, w, bias, out.data_as<T>(), preact, m, n, k, call)) return;
    const BiasAct<T, decltype(act)> epi{out.data_as<T>(), n, bias ? bias->data_as<const T>() : nullptr,
                                        bias ? bias->stride(0) : 0, act, preact};
    if constexpr (std::is_same_v<T, float>) {
      if (nt) {
        sgemm_nt(op, m, n, k, x.data_as<const float>(), lda, w.data_as<const float>(), w.stride(0), epi,
                 cuda::stream_of(call));
        return;
      }
    }
    gemm<cuda::Acc<T>>(op, m, n, k, a, b, epi, cuda::stream_of(call));
  });
}

extern template void forward_as<float>(const KernelCall&, const char*, bool);
extern template void forward_as<double>(const KernelCall&, const char*, bool);
extern template void forward_as<__half>(const KernelCall&, const char*, bool);
extern template void forward_as<__nv_bfloat16>(const KernelCall&, const char*, bool);

}  // namespace opforge::linear_act_cuda
