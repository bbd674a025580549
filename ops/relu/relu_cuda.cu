// relu on CUDA: a grid-stride loop over the shared activation functors (cuda/activation.cuh).
#include "opforge/cuda/activation.cuh"
#include "opforge/registry.h"

namespace opforge::relu_cuda {

void run(const KernelCall& call) { cuda::launch_unary(call, "relu", cuda::Relu{}); }

OPFORGE_KERNEL(relu, "cuda", float_dtypes(), run);

}  // namespace opforge::relu_cuda
