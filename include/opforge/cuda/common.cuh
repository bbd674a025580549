// Shared pieces of opforge's CUDA kernels: element conversions, a strided indexer and
// launch checking. Kernels run on the stream the caller passes in KernelCall::stream().
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
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

// a + b and a * b; integers wrap as NumPy's and torch's do, without C++'s signed-overflow UB.
template <typename A> __device__ __forceinline__ A wrapping_add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <typename A> __device__ __forceinline__ A wrapping_mul(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

// Shape and one operand's strides, passed by value to kernels.
struct Indexer {
  int rank = 0;
  bool narrow = false;  // the shape's product fits in 32 bits: unravel in 32-bit arithmetic
  int64_t shape[kMaxRank];
  int64_t strides[kMaxRank];

  // For linear < the shape's product. The leading dimension needs no division (what is left of
  // linear is its index), so a merged contiguous or row-strided operand costs one multiply: 64-bit
  // divisions are a long instruction sequence on the GPU, which an elementwise kernel cannot hide.
  // 32-bit divisions are several times cheaper than 64-bit ones, hence `narrow`.
  __host__ __device__ __forceinline__ int64_t offset(int64_t linear) const {
    return narrow ? unravel(static_cast<uint32_t>(linear)) : unravel(linear);
  }

  template <typename I>
  __host__ __device__ __forceinline__ int64_t unravel(I rest) const {
    int64_t off = 0;
    for (int d = rank - 1; d > 0; --d) {
      const I size = static_cast<I>(shape[d]), q = rest / size;
      off += static_cast<int64_t>(rest - q * size) * strides[d];
      rest = q;
    }
    return rank > 0 ? off + static_cast<int64_t>(rest) * strides[0] : off;
  }
};

// Size-1 dimensions are dropped and neighbours merged where one lies inside the other
// (stride[d] == stride[d+1] * shape[d+1]): the same offset for every linear index, fewer
// divisions per element, and views of any rank that merge to kMaxRank or fewer dimensions.
inline Indexer make_indexer(const char* op, const Dims& shape, const Dims& strides) {
  Dims sizes, steps;
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
  int64_t product = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    ix.shape[d] = sizes[d];
    ix.strides[d] = steps[d];
    product *= sizes[d];
  }
  ix.narrow = product <= INT32_MAX;
  return ix;
}

// The blocks a grid-stride launch asks for: `wanted`, at most `limit` (65535 in y and z, the
// hardware's; in x, a million blocks fill any GPU many times). The loops cover the rest. The
// emulated tests lower the cap at run time (CUDA_EMU_GRID_CAP), so every grid-stride loop takes
// several trips there, as it does on the GPU only for tensors of a billion elements.
inline unsigned grid_blocks(int64_t wanted, int64_t limit = 65535 * 16) {
#ifdef CUDA_EMU_GRID_CAP
  if (limit > CUDA_EMU_GRID_CAP) limit = CUDA_EMU_GRID_CAP;
#endif
  return static_cast<unsigned>(wanted < limit ? wanted : limit);
}

// Blocks of `threads` for n items, grid-stride beyond grid_blocks' cap.
inline unsigned blocks_for(int64_t n, int threads) { return grid_blocks((n + threads - 1) / threads); }

// Sixteen bytes of T: one vector load or store (LDG.128 / STG.128).
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / static_cast<int>(sizeof(T));
  T v[kSize];
};

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// How a kernel moves its packs (CachedRow, map_contiguous): plain 16-byte loads and stores, the
// ops' choice. cuda/schedule_variants.cuh has the others bench/schedules_cuda.cu times against it.
struct PlainAccess {
  template <class P> __device__ __forceinline__ static P load(const P* p) { return *p; }
  template <class P> __device__ __forceinline__ static void store(P* p, const P& v) { *p = v; }
};

// Packs in flight per thread in map_contiguous. HBM needs several MB in flight to run at full
// speed (Little's law: bandwidth x latency); one 4-byte access per thread keeps ~8 KB per SM
// and the first elementwise kernels here ran at ~40% of the copy bandwidth on the H200.
inline constexpr int kPacksPerThread = 4;

// The operands of map_contiguous. Each one is either shaped like the output (period 0) or
// repeats along it with a period of `period` elements: a bias row broadcast over the rows of x
// (period = the row's length, a whole number of packs) or a single value (period 1).
template <typename T, int K>
struct Operands {
  const T* p[K];
  int64_t period[K] = {};
  bool narrow = true;  // the pack count fits in 32 bits: wrap periods with 32-bit remainders

  // Operand k's pack for the output's pack j (Access's load where the operand is read once).
  template <class Access = PlainAccess>
  __device__ __forceinline__ Pack<T> pack(int k, int64_t j) const {
    const Pack<T>* src = reinterpret_cast<const Pack<T>*>(p[k]);
    if (period[k] == 0) return Access::load(src + j);
    if (period[k] == 1) {
      Pack<T> v;
#pragma unroll
      for (int e = 0; e < Pack<T>::kSize; ++e) v.v[e] = p[k][0];
      return v;
    }
    const int64_t packs = period[k] / Pack<T>::kSize;  // 64-bit remainders are long sequences on the GPU
    return src[narrow ? int64_t(uint32_t(j) % uint32_t(packs)) : j % packs];
  }
  // Operand k's element for the output's element i.
  __device__ __forceinline__ Acc<T> element(int k, int64_t i) const {
    return load(p[k] + (period[k] == 0 ? i : i % period[k]));
  }
};

// How map_contiguous spreads an array's packs over its threads: kPacks per thread, loaded before
// any is stored, a thread's packs a whole grid apart (the ops' own) or, kTiled, each block's packs
// one contiguous tile (a thread's a block apart); blocks of kThreads, packs moved by Access. The
// ops use the default; bench/schedules_cuda.cu times the others beside it.
template <int kPacks_ = kPacksPerThread, bool kTiled_ = false, class Access_ = PlainAccess, int kThreads_ = 256>
struct MapSchedule {
  static constexpr int kPacks = kPacks_;
  static constexpr bool kTiled = kTiled_;
  using Access = Access_;
  static constexpr int kThreads = kThreads_;
};

// out[i] = f(in[0][i], ..., in[K-1][i]) in the accumulation type, over n contiguous elements of
// 16-byte aligned operands, in 16-byte packs (the last n % kSize elements one by one).
template <typename T, int K, class F, class S = MapSchedule<>>
__global__ void __launch_bounds__(S::kThreads) map_contiguous(T* __restrict__ out, Operands<T, K> in, int64_t n, F f) {
  static_assert(K == 1 || K == 2, "map_contiguous applies unary and binary functions");
  using P = Pack<T>;
  constexpr int U = S::kPacks;
  const int64_t packs = n / P::kSize;
  const int64_t threads = int64_t(gridDim.x) * blockDim.x;
  const int64_t id = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  // A thread's u-th pack is first + u * apart; the grid's next group starts threads * U later.
  const int64_t apart = S::kTiled ? int64_t(blockDim.x) : threads;
  const int64_t start = S::kTiled ? blockIdx.x * int64_t(blockDim.x) * U + threadIdx.x : id;
  for (int64_t first = start; first < packs; first += threads * U) {
    P a[K][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = first + u * apart;
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (j < packs) a[k][u] = in.template pack<typename S::Access>(k, j);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = first + u * apart;
      if (j < packs) {
        P o;
#pragma unroll
        for (int e = 0; e < P::kSize; ++e) {
          if constexpr (K == 1) o.v[e] = static_cast<T>(f(static_cast<Acc<T>>(a[0][u].v[e])));
          else o.v[e] = static_cast<T>(f(static_cast<Acc<T>>(a[0][u].v[e]), static_cast<Acc<T>>(a[1][u].v[e])));
        }
        S::Access::store(reinterpret_cast<P*>(out) + j, o);
      }
    }
  }
  const int64_t i = packs * P::kSize + id;  // the tail: fewer than kSize elements
  if (i < n) {
    if constexpr (K == 1) store(out + i, f(in.element(0, i)));
    else store(out + i, f(in.element(0, i), in.element(1, i)));
  }
}

// map_contiguous over n elements of 16-byte aligned operands (the caller checked); n may be 0.
template <typename T, int K, class F, class S = MapSchedule<>>
void launch_map_contiguous(T* out, Operands<T, K> in, int64_t n, F f, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t packs = n / Pack<T>::kSize;
  const int64_t threads_needed = std::max<int64_t>((packs + S::kPacks - 1) / S::kPacks, 1);
  map_contiguous<T, K, F, S><<<blocks_for(threads_needed, S::kThreads), S::kThreads, 0, stream>>>(out, in, n, f);
}

// How `t`, broadcast to `shape`, repeats along that shape's elements in order: 0 when it is
// contiguous and shaped like it; P when its elements are the last P of the shape's, contiguous,
// repeated (leading dimensions broadcast: a bias row, or a single value with P = 1); -1 otherwise.
inline int64_t repeat_period(const TensorView& t, const Dims& shape) {
  if (t.shape == shape) return t.is_contiguous() ? 0 : -1;
  const Dims strides = broadcast_strides(t, shape);
  int64_t period = 1;
  size_t d = shape.size();
  for (; d > 0 && (shape[d - 1] == 1 || strides[d - 1] == period); --d) period *= shape[d - 1];
  for (; d > 0; --d)
    if (shape[d - 1] != 1 && strides[d - 1] != 0) return -1;
  return period;
}

// Launches map_contiguous for out = f(in...) if out is contiguous and each operand is contiguous
// and shaped like it or repeats along it (repeat_period: a whole number of packs, or one value),
// all 16-byte aligned; returns false (nothing launched) otherwise, for the caller's strided kernel.
template <typename T, int K, class F>
bool try_map_contiguous(const TensorView& out, const std::array<const TensorView*, K>& in, F f,
                        cudaStream_t stream) {
  if (!out.is_contiguous() || !aligned16(out.data)) return false;
  Operands<T, K> ops{};
  for (int k = 0; k < K; ++k) {
    const TensorView& t = *in[k];
    int64_t period = repeat_period(t, out.shape);
    if (period == out.numel()) period = 0;  // one repeat: shaped like out but for leading 1s
    if (period < 0 || (period > 1 && period % Pack<T>::kSize != 0) || !aligned16(t.data)) return false;
    ops.p[k] = static_cast<const T*>(t.data);
    ops.period[k] = period;
  }
  ops.narrow = out.numel() / Pack<T>::kSize <= UINT32_MAX;
  launch_map_contiguous<T, K>(static_cast<T*>(out.data), ops, out.numel(), f, stream);
  return true;
}

// A CUDA runtime call's status as opforge's runtime error naming the op and the call.
// The runtime also keeps the status as its "last error" (a failed allocation too): it is
// reported here, so it is cleared, or the next check_launch would report it as its own.
inline void check_cuda(const char* op, cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  fail(ErrorKind::runtime, op, "(): ", what, " failed: ", cudaGetErrorString(status));
}

inline void check_launch(const char* op) {
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) fail(ErrorKind::runtime, op, "(): CUDA launch failed: ", cudaGetErrorString(status));
}

inline cudaStream_t stream_of(const KernelCall& call) { return static_cast<cudaStream_t>(call.stream()); }


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
