// Temporary device memory for CUDA kernels (workspaces: partial sums, sort keys, cuBLASLt's):
// from the framework's allocator where the adapter hands one over (KernelCall::scratch: torch's
// caching allocator, XLA's scratch allocator), else from opforge's own pool on the current device.
// Always stream-ordered: freed behind the work queued on the call's stream, never waited for.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "opforge/error.h"
#include "opforge/kernel.h"

namespace opforge::cuda {

// What opforge's pool keeps across synchronizations. The runtime's default pool keeps nothing: it
// hands its free memory back to the driver at every stream, event or device synchronize, and the
// next allocation maps it again (a step that syncs once, as a training loop reading its loss does,
// would pay that for every workspace). Beyond this, memory still goes back.
inline constexpr uint64_t kPoolKeepBytes = uint64_t{256} << 20;

// From opforge's stream-ordered pool of the current device (made at its first use): *p, `bytes`
// for work on `stream`; the runtime's status, its last error cleared when it failed.
cudaError_t pool_allocate(void** p, size_t bytes, cudaStream_t stream);
// Frees memory from pool_allocate behind the work queued on `stream` so far.
void pool_release(void* p, cudaStream_t stream) noexcept;

// Memory for the kernels of one call, given back when it goes out of scope (in stream order: the
// kernels queued before may still use it). 0 bytes hold nothing (data() is nullptr).
class Scratch {
 public:
  // From `from` (nullptr: opforge's pool) for work on `stream`; data() is nullptr when there was
  // no room, for callers with a way that needs none (cuBLASLt's workspace, say).
  Scratch(ScratchAllocator* from, size_t bytes, cudaStream_t stream) : from_(from), stream_(stream) {
    if (bytes == 0) return;
    if (!from) status_ = pool_allocate(&data_, bytes, stream);
    else if (!(data_ = from->allocate(bytes))) status_ = cudaErrorMemoryAllocation;
  }
  // For `call`'s kernels; no room raises opforge's runtime error naming the op.
  Scratch(const KernelCall& call, size_t bytes)
      : Scratch(call.scratch(), bytes, static_cast<cudaStream_t>(call.stream())) {
    if (status_ != cudaSuccess)
      fail(ErrorKind::runtime, call.op().name(), "(): cannot allocate ", bytes, " bytes of workspace: ",
           cudaGetErrorString(status_));
  }
  ~Scratch() {
    if (!data_) return;
    if (from_) from_->release(data_);
    else pool_release(data_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  ScratchAllocator* from_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaError_t status_ = cudaSuccess;  // why data_ is nullptr for a request of some bytes
};

}  // namespace opforge::cuda
