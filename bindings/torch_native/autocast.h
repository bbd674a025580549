// torch.autocast for opforge ops (bindings/torch_native/autocast.cc).
#pragma once

#include <torch/library.h>

#include <string>

namespace opforge::torch_native {

// Registers, on `m` (an IMPL library of the opforge namespace with no dispatch key), the
// autocast kernels of every op that declares a policy and has none yet; appends problems to
// `errors` instead of throwing.
void implement_autocast(torch::Library& m, std::string& errors);

}  // namespace opforge::torch_native
