// gelu_backward on CUDA: a grid-stride loop over the shared activation functors (cuda/activation.cuh).
#include "opforge/cuda/activation.cuh"
#include "opforge/registry.h"

namespace opforge::gelu_backward_cuda {

void run(const KernelCall& call) {
  if (call.attr_str("approximate") == "tanh") cuda::launch_grad(call, "gelu_backward", cuda::GeluTanhGrad{});
  else cuda::launch_grad(call, "gelu_backward", cuda::GeluErfGrad{});
}

OPFORGE_KERNEL(gelu_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::gelu_backward_cuda
