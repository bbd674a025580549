// Row kernels (norms, softmax: one block per row of the last dimension) over two kinds of row:
// - CachedRow: a contiguous, 16-byte aligned row is read once, in 16-byte packs, into registers,
//   and every pass of the kernel (max, sums, the store) works on those: the row crosses HBM once
//   and each thread keeps kRowPacks loads in flight (what HBM needs to run at full speed). The
//   packs per thread and the kind of load and store are template parameters, so that
//   bench/schedules_cuda.cu can time other choices of the same kernels beside the ops' own;
// - StridedRow: any other row, read in place on every pass (the first kernels' way).
// A kernel body written once against row.each / row.store runs on either, and on the contiguous
// rows of cuda/schedule_variants.cuh (staged in shared memory, reread per pass) that
// bench/schedules_cuda.cu times against CachedRow. A contiguous row type names its element type
// (Element), its packs per thread (kThreadPacks) and the longest row it holds (kMaxPacks), so that
// contiguous_row_threads sizes any of them.
#pragma once

#include <algorithm>
#include <initializer_list>

#include "opforge/cuda/common.cuh"

namespace opforge::cuda {

inline constexpr int kRowPacks = 4;  // packs per thread in a CachedRow

// The most threads a contiguous row kernel runs with: its kernels declare it (__launch_bounds__),
// so the compiler keeps them within the registers a block that size may have.
inline constexpr int kMaxRowThreads = 512;

// v reduced over the block with op (blockDim.x a multiple of 32), the same value in every
// thread: warp shuffles, then the warps' results in a fixed order.
template <typename A, class Op>
__device__ __forceinline__ A block_reduce(A v, Op op) {
  __shared__ A warp_results[32];
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // the previous reduction's reads are done
  if (threadIdx.x % 32 == 0) warp_results[threadIdx.x / 32] = v;
  __syncthreads();
  v = warp_results[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) v = op(v, warp_results[w]);
  return v;
}

// a and b each summed over the block, as block_sum sums them (the same order: the same bits),
// with one exchange through shared memory for both instead of one each.
template <typename A>
__device__ __forceinline__ void block_sum2(A& a, A& b) {
  __shared__ A warp_results[32][2];
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  __syncthreads();  // the previous call's reads are done
  if (threadIdx.x % 32 == 0) {
    warp_results[threadIdx.x / 32][0] = a;
    warp_results[threadIdx.x / 32][1] = b;
  }
  __syncthreads();
  a = warp_results[0][0];
  b = warp_results[0][1];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
    a += warp_results[w][0];
    b += warp_results[w][1];
  }
}

struct Sum {
  template <typename A> __device__ A operator()(A a, A b) const { return a + b; }
};
struct Max {
  template <typename A> __device__ A operator()(A a, A b) const { return fmax(a, b); }
};

template <typename A>
__device__ __forceinline__ A block_sum(A v) { return block_reduce(v, Sum{}); }

// Per-column operands a row kernel's store reads beside the row (weights, biases): element i of
// operand q at p[q][i * step[q]]. A CachedRow store reads them in packs (step 1, 16-byte aligned:
// cached_row_threads checks), which also keeps the kernels' register count down.
template <typename T, int E>
struct Columns {
  const T* p[E];
  int64_t step[E];
};

// body(k, j) for this thread's packs of a row of `count` packs, kPacks at most: its k-th, the
// row's j-th = threadIdx.x + k * blockDim.x (k a constant once unrolled, so per-pack state indexed
// by it stays in registers).
template <int kPacks, class B>
__device__ __forceinline__ void for_row_packs(int64_t count, B body) {
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int64_t j = threadIdx.x + int64_t(k) * blockDim.x;
    if (j < count) body(k, j);
  }
}

// out's pack j, stored by Access, from the row's pack j (v) and the column operands' pack j:
// element e is f(v[e], c) with c[q] operand q's element e (operands of step 1, 16-byte aligned).
template <class Access, typename T, int E, class F>
__device__ __forceinline__ void store_with_columns(T* out, int64_t j, const Pack<T>& v, const Columns<T, E>& cols,
                                                   F f) {
  using P = Pack<T>;
  P in[E];
#pragma unroll
  for (int q = 0; q < E; ++q) in[q] = reinterpret_cast<const P*>(cols.p[q])[j];
  P o;
#pragma unroll
  for (int e = 0; e < P::kSize; ++e) {
    Acc<T> c[E];
#pragma unroll
    for (int q = 0; q < E; ++q) c[q] = static_cast<Acc<T>>(in[q].v[e]);
    o.v[e] = static_cast<T>(f(static_cast<Acc<T>>(v.v[e]), c));
  }
  Access::store(reinterpret_cast<P*>(out) + j, o);
}

// Element i of the row at row[i * step]; this thread's elements are threadIdx.x + k * blockDim.x.
template <typename T>
struct StridedRow {
  const T* row;
  int64_t step, n;

  template <class F> __device__ void each(F f) const {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) f(i, load(row + i * step));
  }
  // out[i] = f(i, x[i]), out contiguous.
  template <class F> __device__ void store(T* out, F f) const {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) cuda::store(out + i, f(i, load(row + i * step)));
  }
  // f(x[i], other[i]) and out[i] = f(x[i], other[i]): two rows of one length walked together.
  template <class F> __device__ void each_with(const StridedRow& other, F f) const {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) f(load(row + i * step), load(other.row + i * other.step));
  }
  template <class F> __device__ void store_with(T* out, const StridedRow& other, F f) const {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      cuda::store(out + i, f(load(row + i * step), load(other.row + i * other.step)));
  }
  // out[i] = f(x[i], c) with c[q] = column operand q at i.
  template <int E, class F> __device__ void store(T* out, const Columns<T, E>& cols, F f) const {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      Acc<T> c[E];
#pragma unroll
      for (int q = 0; q < E; ++q) c[q] = load(cols.p[q] + i * cols.step[q]);
      cuda::store(out + i, f(load(row + i * step), c));
    }
  }
};

// A contiguous row of n elements (a multiple of Pack<T>::kSize), 16-byte aligned, of at most
// kPacks packs per thread; this thread's packs are threadIdx.x + k * blockDim.x.
template <typename T, int kPacks = kRowPacks, class Access = PlainAccess>
struct CachedRow {
  using Element = T;
  using P = Pack<T>;
  static constexpr int kThreadPacks = kPacks;
  static constexpr int64_t kMaxPacks = int64_t(kPacks) * kMaxRowThreads;
  P packs[kPacks];
  int64_t count;  // packs in the row

  __device__ CachedRow(const T* row, int64_t n) : count(n / P::kSize) {
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int64_t j = threadIdx.x + int64_t(k) * blockDim.x;
      if (j < count) packs[k] = Access::load(reinterpret_cast<const P*>(row) + j);
    }
  }
  template <class F> __device__ void each(F f) const {
    for_packs([&](int k, int64_t j) {
#pragma unroll
      for (int e = 0; e < P::kSize; ++e) f(j * P::kSize + e, value(k, e));
    });
  }
  // out[i] = f(i, x[i]), out contiguous and 16-byte aligned.
  template <class F> __device__ void store(T* out, F f) const {
    for_packs([&](int k, int64_t j) { put(out, j, [&](int e) { return f(j * P::kSize + e, value(k, e)); }); });
  }
  // f(x[i], other[i]) and out[i] = f(x[i], other[i]): two cached rows of one length together.
  template <class F> __device__ void each_with(const CachedRow& other, F f) const {
    for_packs([&](int k, int64_t) {
#pragma unroll
      for (int e = 0; e < P::kSize; ++e) f(value(k, e), other.value(k, e));
    });
  }
  template <class F> __device__ void store_with(T* out, const CachedRow& other, F f) const {
    for_packs([&](int k, int64_t j) { put(out, j, [&](int e) { return f(value(k, e), other.value(k, e)); }); });
  }
  // f(k, e, x[i], others[i]...) over this thread's elements (element e of its pack k) of cached
  // rows of one length; k and e are constants once unrolled, so per-element state indexed by
  // them (column sums kept across rows) stays in registers.
  template <class F, class... Rows> __device__ __forceinline__ void each_zip(F f, const Rows&... others) const {
    for_packs([&](int k, int64_t) {
#pragma unroll
      for (int e = 0; e < P::kSize; ++e) f(k, e, value(k, e), others.value(k, e)...);
    });
  }
  // out[i] = f(k, e, x[i], others[i]...), out contiguous and 16-byte aligned.
  template <class F, class... Rows>
  __device__ __forceinline__ void store_zip(T* out, F f, const Rows&... others) const {
    for_packs([&](int k, int64_t j) {
      put(out, j, [&](int e) { return f(k, e, value(k, e), others.value(k, e)...); });
    });
  }
  // body(k, j) for this thread's packs: its k-th, the row's j-th (k a constant once unrolled, so
  // the packs stay in registers).
  template <class B> __device__ __forceinline__ void for_packs(B body) const { for_row_packs<kPacks>(count, body); }
  // out[i] = f(x[i], c) with c[q] = column operand q at i, the operands read in packs too.
  template <int E, class F> __device__ void store(T* out, const Columns<T, E>& cols, F f) const {
    for_packs([&](int k, int64_t j) { store_with_columns<Access>(out, j, packs[k], cols, f); });
  }

 private:
  __device__ __forceinline__ Acc<T> value(int k, int e) const { return static_cast<Acc<T>>(packs[k].v[e]); }
  // out's pack j: element e is value(e), rounded to T.
  template <class V> __device__ __forceinline__ static void put(T* out, int64_t j, V value) {
    P o;
#pragma unroll
    for (int e = 0; e < P::kSize; ++e) o.v[e] = static_cast<T>(value(e));
    Access::store(reinterpret_cast<P*>(out) + j, o);
  }
};

// Threads per block for CachedRow (`packs` packs per thread: its kPacks) over rows of n elements
// of elem_bytes each, a whole number of packs, or 0 where that is more than kMaxRowThreads.
inline int row_threads(int64_t n, int elem_bytes, int packs = kRowPacks) {
  const int64_t per_pack = 16 / elem_bytes;
  const int64_t threads = ((n / per_pack + packs - 1) / packs + 31) / 32 * 32;
  return threads > kMaxRowThreads ? 0 : static_cast<int>(threads < 32 ? 32 : threads);
}

// Threads per block for CachedRow (`packs` per thread) over x's rows (and results written to out,
// column operands read beside them), or 0 where the rows must be read in place: x not contiguous,
// a tensor not 16-byte aligned, a column operand strided, the row length not a whole number of
// packs, or rows longer than kMaxRowThreads threads' packs.
inline int cached_row_threads(const TensorView& x, const TensorView& out, int elem_bytes,
                              std::initializer_list<const TensorView*> columns = {}, int packs = kRowPacks) {
  const int64_t n = x.size(-1);
  if (!x.is_contiguous() || !out.is_contiguous() || !aligned16(x.data) || !aligned16(out.data) ||
      n % (16 / elem_bytes))
    return 0;
  for (const TensorView* c : columns)
    if (c && (c->stride(0) != 1 || !aligned16(c->data))) return 0;
  return row_threads(n, elem_bytes, packs);
}

// cached_row_threads for a kernel over contiguous rows of type Row (CachedRow or one of
// cuda/schedule_variants.cuh's): its packs per thread, and 0 where a row is longer than Row holds.
template <class Row>
int contiguous_row_threads(const TensorView& x, const TensorView& out,
                           std::initializer_list<const TensorView*> columns = {}) {
  constexpr int elem_bytes = sizeof(typename Row::Element);
  if (x.size(-1) / (16 / elem_bytes) > Row::kMaxPacks) return 0;
  return cached_row_threads(x, out, elem_bytes, columns, Row::kThreadPacks);
}

// row_threads for Row over rows of n elements (contiguous, 16-byte aligned), 0 where they are too
// long for it.
template <class Row>
int contiguous_row_threads(int64_t n) {
  constexpr int elem_bytes = sizeof(typename Row::Element);
  return n / (16 / elem_bytes) > Row::kMaxPacks ? 0 : row_threads(n, elem_bytes, Row::kThreadPacks);
}

// Chunks of rows for a kernel that runs a block per chunk and keeps column sums across its rows
// (the norms' backward): about 64k threads in all, so small blocks get more chunks (more rows in
// flight), between 256 and 2048, at most one per row. It depends on the shape only, so the
// column sums' order, and their bits, do too.
inline int64_t row_chunks(int64_t rows, int threads) {
  const int64_t wanted = std::clamp<int64_t>(65536 / threads, 256, 2048);
  return rows < wanted ? rows : wanted;
}

// partial[0 * n + i] + partial[1 * n + i] + ... + partial[(chunks - 1) * n + i], added in that
// order, eight loads ahead of the adds (one load in flight per column would take a memory
// latency per chunk).
template <typename A>
__device__ __forceinline__ A column_sum(const A* partial, int64_t i, int64_t n, int64_t chunks) {
  constexpr int kAhead = 8;
  A sum = partial[i];
  int64_t k = 1;
  for (; k + kAhead <= chunks; k += kAhead) {
    A v[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) v[u] = partial[(k + u) * n + i];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) sum += v[u];
  }
  for (; k < chunks; ++k) sum += partial[k * n + i];
  return sum;
}

inline unsigned row_blocks(int64_t rows) { return grid_blocks(rows); }

}  // namespace opforge::cuda
