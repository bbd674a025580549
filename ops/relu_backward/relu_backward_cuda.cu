// relu_backward on CUDA: a grid-stride loop over the shared activation functors (cuda/activation.cuh).
#include "opforge/cuda/activation.cuh"
#include "opforge/registry.h"

namespace opforge::relu_backward_cuda {

void run(const KernelCall& call) { cuda::launch_grad(call, "relu_backward", cuda::ReluGrad{}); }

OPFORGE_KERNEL(relu_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::relu_backward_cuda
