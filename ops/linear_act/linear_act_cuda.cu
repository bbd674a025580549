// linear_act on CUDA: the tiled product of gemm.cuh with bias and activation in its epilogue
// (or cuBLASLt's product, blaslt.cuh). This file compiles the float32 variant and dispatches;
// linear_act_cuda_<dtype>.cu compile the others.
#include "opforge/registry.h"
#include "ops/linear_act/gemm.cuh"

namespace opforge::linear_act_cuda {

template void forward_as<float>(const KernelCall&, const char*, bool);

void forward(const KernelCall& call, const char* op, bool save_preact) {
  cuda::visit_float(call.tensor("x").dtype, op, [&](auto tag) { forward_as<decltype(tag)>(call, op, save_preact); });
}

void run(const KernelCall& call) { forward(call, "linear_act", false); }

OPFORGE_KERNEL(linear_act, "cuda", float_dtypes(), run);

}  // namespace opforge::linear_act_cuda
