// linear_act's CUDA forward in float64 (dispatched by linear_act_cuda.cu), in a file of its own
// so that the dtypes compile in parallel.
#include "ops/linear_act/gemm.cuh"

namespace opforge::linear_act_cuda {

template void forward_as<double>(const KernelCall&, const char*, bool);

}  // namespace opforge::linear_act_cuda
