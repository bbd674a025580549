// scatter_add_backward on CUDA: the index is checked (the check alone waited for after the gather is
// queued, see scatter_index.cuh) and one thread per output element gathers it; a value out of
// range reads row 0 meanwhile (the call then raises).
#include "opforge/cuda/common.cuh"
#include "opforge/cuda/scratch.h"
#include "opforge/registry.h"
#include "ops/scatter_add/scatter_index.cuh"

namespace opforge::scatter_add_backward_cuda {

using scatter_cuda::kThreads;

template <typename T>
__global__ void gather_kernel(T* out, const T* grad, scatter_cuda::SliceIndexers s, const unsigned long long* index,
                              int64_t n, unsigned long long limit, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = e % s.inner_size, i = (e / s.inner_size) % n, o = e / (s.inner_size * n);
    const unsigned long long row = index[i] < limit ? index[i] : 0;  // negative values are huge here
    out[e] = grad[s.outer.offset(o) + static_cast<int64_t>(row) * s.step + s.inner.offset(k)];
  }
}

void run(const KernelCall& call) {
  const char* op = "scatter_add_backward";
  const TensorView& grad = call.tensor("grad");
  const TensorView& out = call.output();
  const int64_t dim = scatter::checked_dim(call, "grad");
  const int64_t n = call.tensor("index").shape[0];
  cudaStream_t stream = cuda::stream_of(call);
  const auto s = scatter_cuda::slice_indexers(op, grad, dim);
  const cuda::Scratch workspace(call, 8 * (n + 1));
  auto* keys = workspace.as<unsigned long long>();
  const int64_t limit = grad.shape[dim];
  scatter_cuda::IndexCheck check;
  check.launch(call, keys, keys + n, limit);
  cuda::visit(grad.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    const int64_t total = out.numel();
    // Nothing to gather (called for the index check alone, OpDef::validates), or no row to read
    // from (every index value is out of range).
    if (total == 0 || limit == 0) return;
    gather_kernel<T><<<cuda::blocks_for(total, kThreads), kThreads, 0, stream>>>(
        out.data_as<T>(), grad.data_as<const T>(), s, keys, n, static_cast<unsigned long long>(limit), total);
  });
  cuda::check_launch(op);
  if (const auto bad = check.first_bad_index(call, keys))
    scatter::fail_index(call, "grad.shape[dim]", grad.shape[dim], bad->second, bad->first);
}

OPFORGE_KERNEL(scatter_add_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::scatter_add_backward_cuda
