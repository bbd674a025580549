// CUDA side of scatter_add and scatter_add_backward: the index read into uint64 keys and
// bounds-checked on the device. The first bad position (atomicMin: the same whatever the
// schedule) comes back to the host, which raises. Its copy into pinned host memory is queued right
// behind the check's kernel, with an event after it; the op launches its other kernels (their
// memory accesses stay in bounds whatever the index holds) and then waits for that event only,
// not for the stream: the check is the op's first kernel, done long before the host has queued
// the rest, so the call returns while its sums still run and the next call's launches queue behind
// them. (Waiting for the stream, as the first version did, left the H200 idle 46 of every 168 us
// of scatter_add at 16384 x 4096 while the host launched the next call's 11 operations.) The
// failed call's result is never returned. The wait makes these ops unfit for CUDA graph capture:
// inside one they raise at once, before launching anything.
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

// A word of pinned host memory per host thread for the check's result, or null where none could
// be had (the copy then goes to pageable memory, which blocks the host until the check is done).
// A call waits for its copy before it returns, so two calls never share the slot. Kept for the
// thread's life: freeing it at thread exit could come after CUDA's own teardown.
inline unsigned long long* pinned_result_slot() {
  thread_local unsigned long long* slot = [] {
    void* p = nullptr;
    if (cudaHostAlloc(&p, sizeof(unsigned long long), cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();  // not the op's error: the pageable path serves
      return static_cast<unsigned long long*>(nullptr);
    }
    *static_cast<unsigned long long*>(p) = kNone;
    return static_cast<unsigned long long*>(p);
  }();
  return slot;
}

// The index check of one call: launch() queues it, first_bad_index() waits for its result.
// Constructed by the op and never moved (the copy of the result may target the object itself).
class IndexCheck {
 public:
  IndexCheck() = default;
  IndexCheck(const IndexCheck&) = delete;
  IndexCheck& operator=(const IndexCheck&) = delete;
  ~IndexCheck() {
    if (done_) cudaEventDestroy(done_);
  }

  // Launches the check of call's 'index' (n values): fills keys[0, n) (device memory),
  // positions[0, n) with 0, 1, ... unless it is null, and scratch (one device word) with the first
  // position of a value outside [0, limit), then queues that word's copy to the host and an event
  // after it. Nothing waits yet: first_bad_index does, once the op's other kernels are queued.
  void launch(const KernelCall& call, unsigned long long* keys, unsigned long long* scratch, int64_t limit,
              int64_t* positions = nullptr) {
    const char* op = call.op().name().c_str();
    const TensorView& index = call.tensor("index");
    const int64_t n = index.shape[0];
    if (n == 0) return;  // nothing to check or wait for
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
    if (unsigned long long* slot = pinned_result_slot()) result_ = slot;
    cuda::check_cuda(op, cudaMemcpyAsync(result_, scratch, sizeof *result_, cudaMemcpyDeviceToHost, stream),
                     "cudaMemcpyAsync");
    cuda::check_cuda(op, cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    cuda::check_cuda(op, cudaEventRecord(done_, stream), "cudaEventRecord");
  }

  // (position, value) of the first index value outside [0, limit), after waiting for the check
  // alone (keys as launch filled them, read back for the message).
  std::optional<std::pair<int64_t, int64_t>> first_bad_index(const KernelCall& call,
                                                             const unsigned long long* keys) const {
    if (!done_) return std::nullopt;
    const char* op = call.op().name().c_str();
    cuda::check_cuda(op, cudaEventSynchronize(done_), "cudaEventSynchronize");
    const unsigned long long bad = *result_;
    if (bad == kNone) return std::nullopt;
    // A failing call may wait for its stream. On the caller's stream, not cudaMemcpy's legacy
    // default stream (which would also wait for every other blocking stream of the device).
    cudaStream_t stream = cuda::stream_of(call);
    unsigned long long value = 0;
    cuda::check_cuda(op, cudaMemcpyAsync(&value, keys + bad, sizeof value, cudaMemcpyDeviceToHost, stream),
                     "cudaMemcpyAsync");
    cuda::check_cuda(op, cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return std::pair<int64_t, int64_t>{static_cast<int64_t>(bad), static_cast<int64_t>(value)};
  }

 private:
  cudaEvent_t done_ = nullptr;               // recorded after the result's copy
  unsigned long long pageable_ = kNone;      // the result where the thread has no pinned slot
  unsigned long long* result_ = &pageable_;  // where the result lands
};

// [outer dims] and [inner dims] of t around dim, as indexers, plus dim's stride.
struct SliceIndexers {
  cuda::Indexer outer, inner;
  int64_t outer_size = 1, inner_size = 1, step = 0;
};

inline SliceIndexers slice_indexers(const char* op, const TensorView& t, int64_t dim) {
  SliceIndexers s;
  Dims os(t.shape.begin(), t.shape.begin() + dim), ost(t.strides.begin(), t.strides.begin() + dim);
  Dims is(t.shape.begin() + dim + 1, t.shape.end()), ist(t.strides.begin() + dim + 1, t.strides.end());
  s.outer = cuda::make_indexer(op, os, ost);
  s.inner = cuda::make_indexer(op, is, ist);
  for (int64_t e : os) s.outer_size *= e;
  for (int64_t e : is) s.inner_size *= e;
  s.step = t.strides[dim];
  return s;
}

}  // namespace opforge::scatter_cuda
