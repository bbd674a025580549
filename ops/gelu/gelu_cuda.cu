// gelu on CUDA: a grid-stride loop over the shared activation functors (cuda/activation.cuh).
#include "opforge/cuda/activation.cuh"
#include "opforge/registry.h"

namespace opforge::gelu_cuda {

void run(const KernelCall& call) {
  if (call.attr_str("approximate") == "tanh") cuda::launch_unary(call, "gelu", cuda::GeluTanh{});
  else cuda::launch_unary(call, "gelu", cuda::GeluErf{});
}

OPFORGE_KERNEL(gelu, "cuda", float_dtypes(), run);

}  // namespace opforge::gelu_cuda
