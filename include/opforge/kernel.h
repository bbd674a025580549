// The kernel contract. A kernel receives views of its inputs and of outputs already
// allocated by the caller, plus the caller's stream (CUDA) or nullptr (CPU), and where its
// temporary device memory comes from. It never allocates its results and never picks a stream.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "opforge/op.h"

namespace opforge {

// A framework's allocator for a kernel's temporary device memory (its workspaces), handed over
// by the adapter: torch's caching allocator, XLA's scratch allocator. Memory from the framework
// is memory the framework can also give back to its own ops, where memory opforge takes beside
// it (opforge's pool, the default) is not. Bound to the call's device and stream: work the kernel
// queues on that stream may use the memory until release(), and after it, as the framework's own
// stream-ordered allocators promise (the framework reuses it only for work ordered after).
class ScratchAllocator {
 public:
  virtual ~ScratchAllocator() = default;
  // `bytes` (> 0) of device memory, aligned to 16 bytes at least (the frameworks' are to 256 or
  // more; kernels rely on 16); nullptr when the framework has no room.
  virtual void* allocate(size_t bytes) = 0;
  // Gives back memory from allocate() (the framework may also take it all back after the call).
  virtual void release(void* p) noexcept = 0;
};

class KernelCall : public ArgAccess {
 public:
  KernelCall(const OpDef& op, const OpInputs& inputs, std::span<const TensorView> outputs,
             void* stream, ScratchAllocator* scratch = nullptr)
      : ArgAccess(op, inputs), outputs_(outputs), stream_(stream), scratch_(scratch) {}

  const TensorView& output(size_t i = 0) const { return outputs_[i]; }
  size_t num_outputs() const { return outputs_.size(); }
  void* stream() const { return stream_; }
  // The framework's allocator for temporary device memory; nullptr: opforge's own pool
  // (opforge/cuda/scratch.h chooses).
  ScratchAllocator* scratch() const { return scratch_; }

 private:
  std::span<const TensorView> outputs_;
  void* stream_;
  ScratchAllocator* scratch_;
};

using KernelFn = void (*)(const KernelCall& call);

}  // namespace opforge
