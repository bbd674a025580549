// scatter_add on CUDA, deterministic without float atomics: the index is checked (the check
// alone waited for once all the kernels are queued, see scatter_index.cuh), a stable radix sort of
// (index, position) lists each bucket's source positions in increasing order, a binary search
// finds where each bucket starts, and sum_kernel (scatter_add.cuh) sums each output element's
// bucket in that order. Same order as the CPU kernel, so the two agree bit for bit in float32 and float64.
// A bad index leaves the sort's keys out of order, which the later kernels survive: every start
// is a position in [0, n], every position sorted is one of src's.
#include <cub/device/device_radix_sort.cuh>

#include "opforge/cuda/common.cuh"
#include "opforge/cuda/scratch.h"
#include "opforge/registry.h"
#include "ops/scatter_add/scatter_add.cuh"
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
  scatter_cuda::IndexCheck check;
  check.launch(call, keys, scratch, dim_size, out.numel() > 0 ? positions : nullptr);
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
        launch_own_sum<T>(out.data_as<T>(), src.data_as<const T>(), s, start, order, dim_size, out.numel(), stream);
      }
    });
    cuda::check_launch(op);
  }
  if (const auto bad = check.first_bad_index(call, keys))
    scatter::fail_index(call, "dim_size", dim_size, bad->second, bad->first);
}

OPFORGE_KERNEL(scatter_add, "cuda", float_dtypes(), run);

}  // namespace opforge::scatter_add_cuda
