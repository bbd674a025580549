// rope on CUDA: the rotation in rope.cuh, by +theta.
#include "opforge/registry.h"
#include "ops/rope/rope.cuh"

namespace opforge::rope_cuda {
void run(const KernelCall& call) { rotate(call, "rope", call.tensor("x"), /*inverse=*/false); }
OPFORGE_KERNEL(rope, "cuda", float_dtypes(), run);
}  // namespace opforge::rope_cuda
