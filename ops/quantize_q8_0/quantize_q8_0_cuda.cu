// quantize_q8_0 on CUDA: a team of 4 or 8 lanes per 32-value block (opforge/cuda/ggml_quant.cuh),
// the same bytes as the CPU kernel and ggml's reference quantizer.
#include "opforge/cuda/ggml_quant.cuh"
#include "opforge/registry.h"

namespace opforge::quantize_q8_0_cuda {

void run(const KernelCall& call) { cuda::launch_quantize<quant::Format::q8_0>(call, "quantize_q8_0"); }

OPFORGE_KERNEL(quantize_q8_0, "cuda", (std::vector<DType>{DType::float32, DType::float16, DType::bfloat16}), run);

}  // namespace opforge::quantize_q8_0_cuda
