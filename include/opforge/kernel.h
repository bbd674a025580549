// The kernel contract. A kernel receives views of its inputs and of outputs already
// allocated by the caller, plus the caller's stream (CUDA) or nullptr (CPU). It never
// allocates its results and never picks a stream.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "opforge/op.h"

namespace opforge {

class KernelCall : public ArgAccess {
 public:
  KernelCall(const OpDef& op, const OpInputs& inputs, std::span<const TensorView> outputs,
             void* stream)
      : ArgAccess(op, inputs), outputs_(outputs), stream_(stream) {}

  const TensorView& output(size_t i = 0) const { return outputs_[i]; }
  size_t num_outputs() const { return outputs_.size(); }
  void* stream() const { return stream_; }

 private:
  std::span<const TensorView> outputs_;
  void* stream_;
};

using KernelFn = void (*)(const KernelCall& call);

}  // namespace opforge
