// Temporary memory for CPU kernels that does not fault in fresh pages on every call. A model calls
// the same products again and again; fresh memory costs one page fault per 4 KiB on first touch
// (a 2048 x 2048 float operand: 4096 faults, several ms on this project's VMs).
#pragma once

#include <hwy/aligned_allocator.h>

#include <cstdint>

#include "opforge/backend.h"

namespace opforge::cpu {

// A buffer for the calling thread, kept (and grown) between calls: a pool task's scratch. One per
// thread, element type and slot; valid until the same thread asks for the same T and slot again,
// so a kernel must not use one slot at two nesting levels.
template <typename T, int kSlot = 0>
T* thread_scratch(int64_t elements) {
  thread_local hwy::AlignedFreeUniquePtr<T[]> buffer;
  thread_local int64_t size = 0;
  if (size < elements) {
    buffer = hwy::AllocateAligned<T>(elements);
    size = elements;
  }
  return buffer.get();
}

// A block from the CPU backend, which keeps freed blocks of 1 MiB and more mapped for the next
// request of the same size: per-call buffers as big as an operand (packed panels).
template <typename T>
class BackendBuffer {
 public:
  explicit BackendBuffer(int64_t elements)
      : cpu_(lookup_backend("cpu")),
        data_(static_cast<T*>(cpu_->allocate(static_cast<int64_t>(sizeof(T)) * elements, Device{}, nullptr))) {}
  ~BackendBuffer() { cpu_->release(data_, Device{}, nullptr); }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  T* get() const { return data_; }

 private:
  Backend* cpu_;
  T* data_;
};

}  // namespace opforge::cpu
