// linear_act's forward through cuBLASLt (opforge/cuda/blaslt.h) where it takes the case.
// Usually cuBLASLt's epilogue adds the bias and writes the sum in T (into the pre-activation when
// it is saved), and one vectorized pass applies the activation (in place when no pre-activation is
// saved; cuBLASLt's own activations differ: its relu turns NaN into 0, its gelu is the tanh
// approximation). For the half types the sum is rounded to T before the activation, as torch's
// F.linear then F.gelu round it: writing the product in float32 and reading it again cost 1.33x
// torch eager's time (bfloat16, gelu, on the H100, with the product as fast as torch's).
// Where the bias cannot go to the epilogue (strided, misaligned), cuBLASLt writes the product in
// the accumulation type (a workspace for the half types) and one pass adds the bias, stores the
// pre-activation and applies the activation, each result rounded once.
// On the H200, torch.mm's cuBLAS ran float32 at 51.3 TFLOP/s against 11.8 for opforge's first
// tiled kernel; the half types get tensor cores here.
#pragma once

#include <string>
#include <type_traits>

#include "opforge/cuda/blaslt.h"
#include "opforge/cuda/common.cuh"
#include "opforge/cuda/scratch.h"
#include "opforge/kernel.h"

namespace opforge::linear_act_cuda {

// The step between x's rows where its leading dimensions merge into one stride (rows.rank <= 1;
// a single row's step is arbitrary: k), for the products that take a row stride (cuBLASLt, the
// 128 x 128 float32 kernel).
inline int64_t row_stride(const cuda::Indexer& rows, int64_t k) { return rows.rank == 1 ? rows.strides[0] : k; }

// out[e] = act(z[e] + bias[e % n]) and preact[e] = z[e] + bias[e % n] over m x n contiguous
// results. z may be out or preact itself (each element is read before it is written, by one
// thread); I is the index type (32 bits when m * n fits).
template <typename T, typename I, class Act>
__global__ void __launch_bounds__(256) finish_rows(const cuda::Acc<T>* z, const T* bias, int64_t bias_stride, T* out,
                                                   T* preact, I total, I n, Act act) {
  for (I e = blockIdx.x * I(blockDim.x) + threadIdx.x; e < total; e += I(gridDim.x) * blockDim.x) {
    cuda::Acc<T> v = z[e];
    if (bias) v += cuda::load(bias + static_cast<int64_t>(e % n) * bias_stride);
    if (preact) cuda::store(preact + e, v);
    cuda::store(out + e, act(v));
  }
}

// out = act(x @ weight^T + bias) (and preact = the sum before act) on call's stream; false, with
// nothing launched, where cuBLASLt is unavailable or declines (x's rows not one stride apart,
// rows broadcast, a layout or dtype it has no algorithm for, no room for a workspace).
template <typename T, class Act>
bool forward_blaslt(const char* op, const std::string& act_name, Act act, const TensorView& x,
                    const cuda::Indexer& x_rows, const TensorView& w, const TensorView* bias, T* out, T* preact,
                    int64_t m, int64_t n, int64_t k, const KernelCall& call) {
  using A = cuda::Acc<T>;
  const cudaStream_t stream = cuda::stream_of(call);
  if (x_rows.rank > 1) return false;  // x's leading dims do not merge into one row stride
  const cuda::blaslt::Operand xa{x.data, row_stride(x_rows, k), x.stride(-1)};
  const cuda::blaslt::Operand wb{w.data, w.stride(0), w.stride(1)};
  // blaslt::matmul's terms for a bias (packed, 16-byte aligned); others go to the finishing pass
  const bool epilogue_bias = !bias || ((bias->stride(0) == 1 || n == 1) && cuda::aligned16(bias->data));
  T* sum = preact ? preact : out;
  if (epilogue_bias && cuda::aligned16(out) && cuda::aligned16(sum)) {  // the activation's pass in packs
    if (!cuda::blaslt::matmul(op, x.dtype, m, n, k, xa, wb, bias ? bias->data : nullptr, sum, x.dtype, stream,
                              call.scratch()))
      return false;
    if (act_name != "none" || sum != out) {
      cuda::launch_map_contiguous<T, 1>(out, {{sum}}, m * n, act, stream);
      cuda::check_launch(op);
    }
    return true;
  }

  constexpr bool same = std::is_same_v<A, T>;
  const DType acc_dtype = same ? x.dtype : DType::float32;
  // The product in A: a workspace for the half types (no room: opforge's own kernel needs none).
  const cuda::Scratch workspace(call.scratch(), same ? 0 : sizeof(A) * m * n, stream);
  A* z = nullptr;
  if constexpr (same) z = preact ? preact : out;
  else if (!(z = workspace.as<A>())) return false;
  if (!cuda::blaslt::matmul(op, x.dtype, m, n, k, xa, wb, nullptr, z, acc_dtype, stream, call.scratch())) return false;
  const T* bias_data = bias ? bias->data_as<const T>() : nullptr;
  const int64_t bias_stride = bias ? bias->stride(0) : 0;
  const int64_t total = m * n;
  const unsigned blocks = cuda::blocks_for(total, 256);
  if (total < (int64_t(1) << 31))
    finish_rows<T, uint32_t><<<blocks, 256, 0, stream>>>(z, bias_data, bias_stride, out, preact, uint32_t(total),
                                                          uint32_t(n), act);
  else
    finish_rows<T, int64_t><<<blocks, 256, 0, stream>>>(z, bias_data, bias_stride, out, preact, total, n, act);
  cuda::check_launch(op);
  return true;
}

}  // namespace opforge::linear_act_cuda
