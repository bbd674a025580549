// Shared pieces of opforge's CUDA kernels: element conversions, a strided indexer and
// launch checking. Kernels run on the stream the caller passes in KernelCall::stream().
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <vector>

#include "opforge/error.h"
#include "opforge/kernel.h"

namespace opforge::cuda {

inline constexpr int kMaxRank = 8;

// The type arithmetic happens in: float for the half types, the type itself otherwise.
template <typename T> struct AccOf { using type = T; };
template <> struct AccOf<__half> { using type = float; };
template <> struct AccOf<__nv_bfloat16> { using type = float; };
template <typename T> using Acc = typename AccOf<T>::type;

template <typename T> __device__ __forceinline__ Acc<T> load(const T* p) { return static_cast<Acc<T>>(*p); }
template <typename T> __device__ __forceinline__ void store(T* p, Acc<T> v) { *p = static_cast<T>(v); }

// Shape and one operand's strides, passed by value to kernels.
struct Indexer {
  int rank = 0;
  int64_t shape[kMaxRank];
  int64_t strides[kMaxRank];

  __host__ __device__ __forceinline__ int64_t offset(int64_t linear) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      off += (linear % shape[d]) * strides[d];
      linear /= shape[d];
    }
    return off;
  }
};

// Size-1 dimensions are dropped and neighbours merged where one lies inside the other
// (stride[d] == stride[d+1] * shape[d+1]): the same offset for every linear index, fewer
// divisions per element, and views of any rank that merge to kMaxRank or fewer dimensions.
inline Indexer make_indexer(const char* op, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  std::vector<int64_t> sizes, steps;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!sizes.empty() && steps.back() == strides[d] * shape[d]) {
      sizes.back() *= shape[d];
      steps.back() = strides[d];
    } else {
      sizes.push_back(shape[d]);
      steps.push_back(strides[d]);
    }
  }
  if (sizes.size() > kMaxRank)
    fail(ErrorKind::value, op, "(): cuda kernels support tensors whose strides merge to at most ", kMaxRank,
         " dimensions; this one (rank ", shape.size(), ") keeps ", sizes.size(), ": make it contiguous first");
  Indexer ix;
  ix.rank = static_cast<int>(sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d) {
    ix.shape[d] = sizes[d];
    ix.strides[d] = steps[d];
  }
  return ix;
}

// A CUDA runtime call's status as opforge's runtime error naming the op and the call.
inline void check_cuda(const char* op, cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail(ErrorKind::runtime, op, "(): ", what, " failed: ", cudaGetErrorString(status));
}

inline void check_launch(const char* op) {
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) fail(ErrorKind::runtime, op, "(): CUDA launch failed: ", cudaGetErrorString(status));
}

inline cudaStream_t stream_of(const KernelCall& call) { return static_cast<cudaStream_t>(call.stream()); }

inline unsigned blocks_for(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);  // grid-stride loops cover the rest
}

// Calls f(T{}) with the CUDA element type for a float or integer dtype.
template <typename F>
void visit(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::float32: return f(float{});
    case DType::float64: return f(double{});
    case DType::float16: return f(__half{});
    case DType::bfloat16: return f(__nv_bfloat16{});
    case DType::int32: return f(int32_t{});
    case DType::int64: return f(int64_t{});
    default: fail(ErrorKind::not_implemented, op, "(): cuda kernel has no ", dtype_name(dtype), " variant");
  }
}

}  // namespace opforge::cuda
