// rope_backward on CUDA: the rotation in ops/rope/rope.cuh, by -theta.
#include "opforge/registry.h"
#include "ops/rope/rope.cuh"

namespace opforge::rope_backward_cuda {
void run(const KernelCall& call) { rope_cuda::rotate(call, "rope_backward", call.tensor("grad"), /*inverse=*/true); }
OPFORGE_KERNEL(rope_backward, "cuda", float_dtypes(), run);
}  // namespace opforge::rope_backward_cuda
