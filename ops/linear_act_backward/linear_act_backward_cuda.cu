// linear_act_backward on CUDA (backward.cuh): this file compiles the float32 variant and
// dispatches; linear_act_backward_cuda_<dtype>.cu compile the others.
#include "opforge/registry.h"
#include "ops/linear_act_backward/backward.cuh"

namespace opforge::linear_act_backward_cuda {

template void backward_as<float>(const KernelCall&);

void run(const KernelCall& call) {
  cuda::visit_float(call.tensor("x").dtype, "linear_act_backward", [&](auto tag) { backward_as<decltype(tag)>(call); });
}

OPFORGE_KERNEL(linear_act_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::linear_act_backward_cuda
