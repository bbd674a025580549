// CUDA side of scatter_add and scatter_add_backward: the index read into uint64 keys and
// bounds-checked on the device. The first bad position (atomicMin: the same whatever the
// schedule) comes back to the host, which raises. The op launches its kernels between the check's
// launch and its result (their memory accesses stay in bounds whatever the index holds): the one
// wait on the stream then comes after all of the op's work is queued, so the device never idles
// while the host launches the rest. The failed call's result is never returned. That wait makes
// these ops unfit for CUDA graph capture: inside one they raise at once, before launching anything.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "opforge/cuda/common.cuh"
#include "ops/scatter_add/scatter_layout.h"

namespace opforge::scatter_cuda {

constexpr int kThreads = 256;
constexpr unsigned long long kNone = ~0ull;

// keys[i] = index[i], positions[i] = i where positions is not null (a sort's values, in the same
// launch), and the first position of a value outside [0, limit) into *first_bad.
template <typename I>
__global__ void read_kernel(unsigned long long* keys, int64_t* positions, unsigned long long* first_bad,
                            const I* index, int64_t stride, int64_t n, int64_t limit) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = index[i * stride];
    keys[i] = static_cast<unsigned long long>(v);
    if (positions) positions[i] = i;
    if (v < 0 || v >= limit) atomicMin(first_bad, static_cast<unsigned long long>(i));
  }
}

// Launches the check of call's 'index' (n values): fills keys[0, n) (device memory), positions[0,
// n) with 0, 1, ... unless it is null, and scratch (one device word) with the first position of a
// value outside [0, limit). Nothing to wait for yet: first_bad_index reads the result.
inline void launch_index_check(const KernelCall& call, unsigned long long* keys, unsigned long long* scratch,
                               int64_t limit, int64_t* positions = nullptr) {
  const char* op = call.op().name().c_str();
  const TensorView& index = call.tensor("index");
  const int64_t n = index.shape[0];
  if (n == 0) return;
  cudaStream_t stream = cuda::stream_of(call);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cuda::check_cuda(op, cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone)
    fail(ErrorKind::not_implemented, op,
         "(): cannot run inside a CUDA graph capture: its index check waits for the device");
  cuda::check_cuda(op, cudaMemsetAsync(scratch, 0xff, sizeof(unsigned long long), stream), "cudaMemsetAsync");
  if (index.dtype == DType::int32)
    read_kernel<<<cuda::blocks_for(n, kThreads), kThreads, 0, stream>>>(
        keys, positions, scratch, index.data_as<const int32_t>(), index.strides[0], n, limit);
  else
    read_kernel<<<cuda::blocks_for(n, kThreads), kThreads, 0, stream>>>(
        keys, positions, scratch, index.data_as<const int64_t>(), index.strides[0], n, limit);
  cuda::check_launch(op);
}

// (position, value) of the first index value outside [0, limit) that launch_index_check found,
// after waiting for the stream (for the op's kernels queued after the check too).
inline std::optional<std::pair<int64_t, int64_t>> first_bad_index(const KernelCall& call,
                                                                   const unsigned long long* keys,
                                                                   const unsigned long long* scratch) {
  if (call.tensor("index").shape[0] == 0) return std::nullopt;
  const char* op = call.op().name().c_str();
  cudaStream_t stream = cuda::stream_of(call);
  unsigned long long bad = kNone, value = 0;
  cuda::check_cuda(op, cudaMemcpyAsync(&bad, scratch, sizeof bad, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  cuda::check_cuda(op, cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (bad == kNone) return std::nullopt;
  // On the caller's stream, not cudaMemcpy's legacy default stream (which would also wait for
  // every other blocking stream of the device).
  cuda::check_cuda(op, cudaMemcpyAsync(&value, keys + bad, sizeof value, cudaMemcpyDeviceToHost, stream),
                   "cudaMemcpyAsync");
  cuda::check_cuda(op, cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return std::pair<int64_t, int64_t>{static_cast<int64_t>(bad), static_cast<int64_t>(value)};
}

// [outer dims] and [inner dims] of t around dim, as indexers, plus dim's stride.
struct SliceIndexers {
  cuda::Indexer outer, inner;
  int64_t outer_size = 1, inner_size = 1, step = 0;
};

inline SliceIndexers slice_indexers(const char* op, const TensorView& t, int64_t dim) {
  SliceIndexers s;
  std::vector<int64_t> os(t.shape.begin(), t.shape.begin() + dim), ost(t.strides.begin(), t.strides.begin() + dim);
  std::vector<int64_t> is(t.shape.begin() + dim + 1, t.shape.end()), ist(t.strides.begin() + dim + 1, t.strides.end());
  s.outer = cuda::make_indexer(op, os, ost);
  s.inner = cuda::make_indexer(op, is, ist);
  for (int64_t e : os) s.outer_size *= e;
  for (int64_t e : is) s.inner_size *= e;
  s.step = t.strides[dim];
  return s;
}

}  // namespace opforge::scatter_cuda
