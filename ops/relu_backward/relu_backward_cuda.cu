// relu_backward on CUDA: a grid-stride loop over the shared activation functors (cuda/activation.cuh).
#include "opforge/cuda/activation.cuh"
#include "opforge/registry.h"

namespace opforge::relu_backward_cuda {

// ReluGrad's second operand is relu's result here: positive exactly where relu's input is.
void run(const KernelCall& call) { cuda::launch_grad(call, "relu_backward", cuda::ReluGrad{}, "result"); }

OPFORGE_KERNEL(relu_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::relu_backward_cuda
