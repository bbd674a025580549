// linear_act on CUDA: the tiled product of gemm.cuh with bias and activation in its epilogue.
#include "opforge/registry.h"
#include "ops/linear_act/gemm.cuh"

namespace opforge::linear_act_cuda {

void run(const KernelCall& call) { forward(call, "linear_act", false); }

OPFORGE_KERNEL(linear_act, "cuda", float_dtypes(), run);

}  // namespace opforge::linear_act_cuda
