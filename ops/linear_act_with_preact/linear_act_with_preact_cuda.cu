// linear_act_with_preact on CUDA: linear_act's forward (ops/linear_act/gemm.cuh), its epilogue
// also storing the pre-activation.
#include "opforge/registry.h"
#include "ops/linear_act/gemm.cuh"

namespace opforge::linear_act_with_preact_cuda {

void run(const KernelCall& call) { linear_act_cuda::forward(call, "linear_act_with_preact", true); }

OPFORGE_KERNEL(linear_act_with_preact, "cuda", float_dtypes(), run);

}  // namespace opforge::linear_act_with_preact_cuda
