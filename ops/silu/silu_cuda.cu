// silu on CUDA: a grid-stride loop over the shared activation functors (cuda/activation.cuh).
#include "opforge/cuda/activation.cuh"
#include "opforge/registry.h"

namespace opforge::silu_cuda {

void run(const KernelCall& call) { cuda::launch_unary(call, "silu", cuda::Silu{}); }

OPFORGE_KERNEL(silu, "cuda", float_dtypes(), run);

}  // namespace opforge::silu_cuda
