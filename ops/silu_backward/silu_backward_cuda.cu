// silu_backward on CUDA: a grid-stride loop over the shared activation functors (cuda/activation.cuh).
#include "opforge/cuda/activation.cuh"
#include "opforge/registry.h"

namespace opforge::silu_backward_cuda {

void run(const KernelCall& call) { cuda::launch_grad(call, "silu_backward", cuda::SiluGrad{}); }

OPFORGE_KERNEL(silu_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::silu_backward_cuda
