// scatter_add's summing kernel on CUDA: each output element is the sum of its bucket's source
// values in the order the sort left them (increasing position: the CPU kernel's order, so the two
// agree bit for bit). Here, apart from the op's other kernels in scatter_add_cuda.cu, so that
// bench/schedules_cuda.cu can time it under other schedules (loads ahead, block size, columns per
// thread) beside the op's own.
#pragma once

#include <cstdint>

#include "opforge/cuda/common.cuh"
#include "ops/scatter_add/scatter_index.cuh"

namespace opforge::scatter_add_cuda {

// How sum_kernel walks the buckets:
// - kAhead: source rows a thread loads ahead of its adds (the last group of a bucket too,
//   predicated), while the adds stay one after another in bucket order. Few outputs with long
//   buckets (16 buckets of 1024 rows in the benchmark: 65536 outputs) leave the loads in flight per
//   thread as the only way to cover HBM's latency: 8 ahead, with the bucket's last rows loaded one
//   at a time, reached 41% of the H100's copy bandwidth (including the sort and the index check);
// - kThreads: threads per block;
// - kColumns: adjacent outputs per thread, read from each source row as one vector load
//   (columns_fit says where the layout allows more than 1): fewer, wider loads for the same bytes
//   in flight, and a block's share of each source row kColumns times longer.
template <int kAhead_ = 32, int kThreads_ = 256, int kColumns_ = 1>
struct SumSchedule {
  static constexpr int kAhead = kAhead_;
  static constexpr int kThreads = kThreads_;
  static constexpr int kColumns = kColumns_;
};

// The schedules the op runs (launch_own_sum), from bench/schedules_cuda.cu's table on the H200
// (2026-11-27: 16384 x 4096 rows into 16 buckets, every schedule's sums equal bit for bit):
// - OwnPairSum where columns_fit(2) and the elements are 4 bytes or fewer: two adjacent outputs
//   per thread, 128 threads, 32 rows ahead; 84.5 us where one column took 99.9 in float32
//   (1.18x), 119.9 where it took 317.5 in bfloat16 (2.65x). Not for 8-byte elements: 32 rows of
//   16-byte loads ahead hold 128 registers of loads alone;
// - OwnSum<T> elsewhere: one column, 256 threads, 32 rows ahead, 16 for 2-byte elements (220.4
//   where 32 took 317.5 us in bfloat16: 76 registers instead of 104, 3 blocks per SM instead of 2).
template <typename T>
using OwnSum = SumSchedule<sizeof(T) == 2 ? 16 : 32>;
using OwnPairSum = SumSchedule<32, 128, 2>;

// Bucket positions a block stages in shared memory at a time, where all its threads sum the same
// bucket (rows of at least a block's width: the benchmark's): each position is read once per
// block, coalesced, where every thread read each one itself, and its source loads waited on that
// load (a global load's latency ahead of every kAhead loads from HBM).
constexpr int kStaged = 512;

// kColumns adjacent elements, loaded as one access.
template <typename T, int kColumns>
struct alignas(sizeof(T) * kColumns) ColumnVector {
  T v[kColumns];
};

// acc[c] += the source values at base[position(p) * step + c] for p in [begin, end), in that
// order, kAhead rows loaded ahead of the adds.
template <int kAhead, int kColumns, typename A, typename T, class Position>
__device__ __forceinline__ void sum_in_order(A (&acc)[kColumns], const T* base, int64_t step, int64_t begin,
                                             int64_t end, Position position) {
  using V = ColumnVector<T, kColumns>;
  for (int64_t p = begin; p < end; p += kAhead) {
    A v[kAhead][kColumns];
#pragma unroll
    for (int u = 0; u < kAhead; ++u)
      if (p + u < end) {
        const V loaded = *reinterpret_cast<const V*>(base + position(p + u) * step);
#pragma unroll
        for (int c = 0; c < kColumns; ++c) v[u][c] = static_cast<A>(loaded.v[c]);
      }
#pragma unroll
    for (int u = 0; u < kAhead; ++u)
      if (p + u < end)
#pragma unroll
        for (int c = 0; c < kColumns; ++c) acc[c] += v[u][c];
  }
}

// out[e] = the sum of its bucket's source values, in order. Output e is element k of slice j of
// outer index o; a thread takes S::kColumns consecutive outputs, a block S::kThreads threads' (all
// threads take every trip of the grid-stride loop, for the barriers). kColumns > 1 only where
// columns_fit.
template <typename T, class S>
__global__ void __launch_bounds__(S::kThreads)
    sum_kernel(T* out, const T* src, scatter_cuda::SliceIndexers s, const int64_t* start, const int64_t* order,
               int64_t dim_size, int64_t total) {
  constexpr int C = S::kColumns;
  using A = cuda::Acc<T>;
  __shared__ int64_t staged[kStaged];
  const int64_t slice = s.inner_size;
  const int64_t per_block = int64_t(blockDim.x) * C;
  for (int64_t e0 = blockIdx.x * per_block; e0 < total; e0 += int64_t(gridDim.x) * per_block) {
    const int64_t e = e0 + int64_t(threadIdx.x) * C;  // this thread's first output
    const bool active = e < total;
    const int64_t j = (e / slice) % dim_size, o = e / (slice * dim_size);
    const T* base = src + s.outer.offset(o) + s.inner.offset(e % slice);
    A acc[C] = {};
    const int64_t last = (e0 + per_block < total ? e0 + per_block : total) - 1;
    if (e0 / slice == last / slice) {  // one bucket for the block's outputs (a uniform branch)
      const int64_t bucket = (e0 / slice) % dim_size;  // j of every active thread; the bounds of all
      const int64_t end = start[bucket + 1];
      for (int64_t p0 = start[bucket]; p0 < end; p0 += kStaged) {
        const int64_t count = end - p0 < kStaged ? end - p0 : kStaged;
        __syncthreads();  // the previous chunk's reads are done
        for (int64_t t = threadIdx.x; t < count; t += blockDim.x) staged[t] = order[p0 + t];
        __syncthreads();
        if (active) sum_in_order<S::kAhead>(acc, base, s.step, 0, count, [&](int64_t q) { return staged[q]; });
      }
    } else if (active) {
      sum_in_order<S::kAhead>(acc, base, s.step, start[j], start[j + 1], [&](int64_t p) { return order[p]; });
    }
    if (active)
#pragma unroll
      for (int c = 0; c < C; ++c) cuda::store(out + e + c, acc[c]);
  }
}

// sum_kernel<T, S> over the total = out.numel() outputs on stream (S's kColumns only where
// columns_fit).
template <typename T, class S>
void launch_sum(T* out, const T* src, const scatter_cuda::SliceIndexers& s, const int64_t* start, const int64_t* order,
                int64_t dim_size, int64_t total, cudaStream_t stream) {
  sum_kernel<T, S><<<cuda::blocks_for(total / S::kColumns, S::kThreads), S::kThreads, 0, stream>>>(
      out, src, s, start, order, dim_size, total);
}

// Whether sum_kernel may take `columns` outputs per thread over src's slices s (elements of
// elem_bytes) into out (contiguous): each thread's outputs adjacent in every source row (the
// slices contiguous, a whole number of vectors long) and every vector aligned to its size.
inline bool columns_fit(int columns, const scatter_cuda::SliceIndexers& s, const void* src, const void* out,
                        int elem_bytes) {
  if (columns == 1) return true;
  if (s.inner_size % columns || s.inner.rank != 1 || s.inner.strides[0] != 1 || s.step % columns) return false;
  for (int d = 0; d < s.outer.rank; ++d)
    if (s.outer.strides[d] % columns) return false;
  const uintptr_t bytes = uintptr_t(columns) * elem_bytes;
  return reinterpret_cast<uintptr_t>(src) % bytes == 0 && reinterpret_cast<uintptr_t>(out) % bytes == 0;
}

// sum_kernel under the op's schedule for this layout: OwnPairSum where its columns fit, else
// OwnSum<T>.
template <typename T>
void launch_own_sum(T* out, const T* src, const scatter_cuda::SliceIndexers& s, const int64_t* start,
                    const int64_t* order, int64_t dim_size, int64_t total, cudaStream_t stream) {
  if (sizeof(T) <= 4 && columns_fit(OwnPairSum::kColumns, s, src, out, sizeof(T)))
    launch_sum<T, OwnPairSum>(out, src, s, start, order, dim_size, total, stream);
  else
    launch_sum<T, OwnSum<T>>(out, src, s, start, order, dim_size, total, stream);
}

}  // namespace opforge::scatter_add_cuda
