// scatter_add on CUDA, deterministic without float atomics: the index is checked (its result
// waited for once all the kernels are queued, see scatter_index.cuh), a stable radix sort of
// (index, position) lists each bucket's source positions in increasing order, a binary search
// finds where each bucket starts, and one thread per output element sums its bucket in that
// order. Same order as the CPU kernel, so the two agree bit for bit in float32 and float64.
// A bad index leaves the sort's keys out of order, which the later kernels survive: every start
// is a position in [0, n], every position sorted is one of src's.
#include <cub/device/device_radix_sort.cuh>

#include "opforge/cuda/common.cuh"
#include "opforge/cuda/scratch.h"
#include "opforge/registry.h"
#include "ops/scatter_add/scatter_index.cuh"

namespace opforge::scatter_add_cuda {

using scatter_cuda::kThreads;
using Key = unsigned long long;

// start[j] = first p with sorted[p] >= j, for j in [0, dim_size].
__global__ void start_kernel(int64_t* start, const Key* sorted, int64_t n, int64_t dim_size) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j <= dim_size; j += int64_t(gridDim.x) * blockDim.x) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (sorted[mid] < static_cast<Key>(j)) lo = mid + 1; else hi = mid;
    }
    start[j] = lo;
  }
}

// Source rows a thread loads ahead of its adds, the last group of a bucket too (predicated), while
// the adds stay one after another in bucket order (the CPU's bits). Few outputs with long buckets
// (16 buckets of 1024 rows in the benchmark: 65536 threads) leave the loads in flight per thread as
// the only way to cover HBM's latency: 8 ahead, with the bucket's last rows loaded one at a time,
// reached 41% of the H100's copy bandwidth (including the sort and the index check).
constexpr int kAhead = 32;

// Bucket positions a block stages in shared memory at a time, where all its threads sum the same
// bucket (rows of at least a block's width: the benchmark's): each position is read once per
// block, coalesced, where every thread read each one itself, and its source loads waited on that
// load (a global load's latency ahead of every kAhead loads from HBM).
constexpr int kStaged = 512;

// acc += the source values at positions position(p) for p in [begin, end), in that order, kAhead
// loads ahead of the adds.
template <typename A, typename T, class Position>
__device__ __forceinline__ void sum_in_order(A& acc, const T* base, int64_t step, int64_t begin, int64_t end,
                                             Position position) {
  for (int64_t p = begin; p < end; p += kAhead) {
    A v[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u)
      if (p + u < end) v[u] = cuda::load(base + position(p + u) * step);
#pragma unroll
    for (int u = 0; u < kAhead; ++u)
      if (p + u < end) acc += v[u];
  }
}

// out[e] = the sum of its bucket's source values, in order. Output e is element k of slice j of
// outer index o; a block takes blockDim.x consecutive outputs (all threads take every trip of the
// grid-stride loop, for the barriers).
template <typename T>
__global__ void __launch_bounds__(kThreads) sum_kernel(T* out, const T* src, scatter_cuda::SliceIndexers s,
                                                       const int64_t* start, const int64_t* order, int64_t dim_size,
                                                       int64_t total) {
  using A = cuda::Acc<T>;
  __shared__ int64_t staged[kStaged];
  const int64_t slice = s.inner_size;
  for (int64_t e0 = blockIdx.x * int64_t(blockDim.x); e0 < total; e0 += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = e0 + threadIdx.x;
    const bool active = e < total;
    const int64_t j = (e / slice) % dim_size, o = e / (slice * dim_size);
    const T* base = src + s.outer.offset(o) + s.inner.offset(e % slice);
    A acc = 0;
    const int64_t last = (e0 + blockDim.x < total ? e0 + blockDim.x : total) - 1;
    if (e0 / slice == last / slice) {  // one bucket for the block's outputs (a uniform branch)
      const int64_t bucket = (e0 / slice) % dim_size;  // j of every active thread; the bounds of all
      const int64_t end = start[bucket + 1];
      for (int64_t p0 = start[bucket]; p0 < end; p0 += kStaged) {
        const int64_t count = end - p0 < kStaged ? end - p0 : kStaged;
        __syncthreads();  // the previous chunk's reads are done
        for (int64_t t = threadIdx.x; t < count; t += blockDim.x) staged[t] = order[p0 + t];
        __syncthreads();
        if (active) sum_in_order(acc, base, s.step, 0, count, [&](int64_t q) { return staged[q]; });
      }
    } else if (active) {
      sum_in_order(acc, base, s.step, start[j], start[j + 1], [&](int64_t p) { return order[p]; });
    }
    if (active) cuda::store(out + e, acc);
  }
}

void run(const KernelCall& call) {
  const char* op = "scatter_add";
  const TensorView& src = call.tensor("src");
  const TensorView& out = call.output();
  const int64_t dim = scatter::checked_dim(call, "src");
  const int64_t dim_size = call.attr_int("dim_size");
  const int64_t n = src.shape[dim];
  cudaStream_t stream = cuda::stream_of(call);
  const auto s = scatter_cuda::slice_indexers(op, src, dim);

  // Workspace: keys, sorted keys, positions, sorted positions, bucket starts, one scratch word,
  // then cub's temporary storage.
  int end_bit = 1;
  while (end_bit < 63 && (int64_t{1} << end_bit) < dim_size) ++end_bit;
  size_t sort_bytes = 0;
  cuda::check_cuda(op, cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const Key*>(nullptr),
                                                       static_cast<Key*>(nullptr), static_cast<const int64_t*>(nullptr),
                                                       static_cast<int64_t*>(nullptr), n, 0, end_bit, stream),
                   "cub::DeviceRadixSort sizing");
  const size_t words = 4 * n + (dim_size + 1) + 1;
  const cuda::Scratch workspace(call, words * 8 + sort_bytes);
  Key* keys = workspace.as<Key>();
  Key* sorted = keys + n;
  int64_t* positions = reinterpret_cast<int64_t*>(sorted + n);
  int64_t* order = positions + n;
  int64_t* start = order + n;
  Key* scratch = reinterpret_cast<Key*>(start + dim_size + 1);
  void* sort_storage = workspace.as<char>() + words * 8;
  // With the keys, the sort's values: positions 0, 1, ... (none for the index check alone).
  scatter_cuda::launch_index_check(call, keys, scratch, dim_size, out.numel() > 0 ? positions : nullptr);
  if (out.numel() > 0) {  // else called for the index check alone (OpDef::validates)
    if (n > 0) {
      cuda::check_cuda(op, cub::DeviceRadixSort::SortPairs(sort_storage, sort_bytes, keys, sorted, positions, order,
                                                           n, 0, end_bit, stream),
                       "cub::DeviceRadixSort::SortPairs");
    }
    start_kernel<<<cuda::blocks_for(dim_size + 1, kThreads), kThreads, 0, stream>>>(start, sorted, n, dim_size);
    cuda::check_launch(op);
    cuda::visit(src.dtype, op, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_integral_v<T>) {
        fail(ErrorKind::not_implemented, "scatter_add(): no integer kernel");
      } else {
        const int64_t total = out.numel();
        sum_kernel<T><<<cuda::blocks_for(total, kThreads), kThreads, 0, stream>>>(
            out.data_as<T>(), src.data_as<const T>(), s, start, order, dim_size, total);
      }
    });
    cuda::check_launch(op);
  }
  if (const auto bad = scatter_cuda::first_bad_index(call, keys, scratch))
    scatter::fail_index(call, "dim_size", dim_size, bad->second, bad->first);
}

OPFORGE_KERNEL(scatter_add, "cuda", float_dtypes(), run);

}  // namespace opforge::scatter_add_cuda
