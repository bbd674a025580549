// linear_act_backward on CUDA in bfloat16 (dispatched by linear_act_backward_cuda.cu), in a file of
// its own so that the dtypes compile in parallel.
#include "ops/linear_act_backward/backward.cuh"

namespace opforge::linear_act_backward_cuda {

template void backward_as<__nv_bfloat16>(const KernelCall&);

}  // namespace opforge::linear_act_backward_cuda
