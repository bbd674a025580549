// Shared pieces of opforge's CUDA kernels: element conversions, a strided indexer and
// launch checking. Kernels run on the stream the caller passes in KernelCall::stream().
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>

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

  __device__ __forceinline__ int64_t offset(int64_t linear) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      off += (linear % shape[d]) * strides[d];
      linear /= shape[d];
    }
    return off;
  }
};

inline Indexer make_indexer(const char* op, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  if (shape.size() > kMaxRank)
    fail(ErrorKind::value, op, "(): cuda kernels support rank <= ", kMaxRank, ", got rank ", shape.size());
  Indexer ix;
  ix.rank = static_cast<int>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    ix.shape[d] = shape[d];
    ix.strides[d] = strides[d];
  }
  return ix;
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
