// matmul_q on CUDA: the kernels of matmul_q.cuh on the caller's stream, x quantized into a
// stream-ordered workspace unless the product is one launch.
#include "ops/matmul_q/matmul_q.cuh"
#include "opforge/cuda/scratch.h"
#include "opforge/registry.h"

namespace opforge::matmul_q_cuda {

void run(const KernelCall& call) {
  const char* op = "matmul_q";
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("w");
  const TensorView& out = call.output();
  const quant::Format format = quant::format_of(call);
  const int64_t k = x.size(-1), nb = k / quant::kBlock, n = w.size(0);
  const int64_t m = out.numel() / n;  // out is not empty: run_kernel skips empty results
  const int64_t blocks = m * nb;
  const bool fused = fuses_row(m, nb);
  const cuda::Scratch workspace(call, fused ? 0 : quantized_x_bytes(blocks));
  const QuantizedX xq = blocks > 0 && !fused ? quantized_x_at(workspace.as<char>(), blocks) : QuantizedX{};
  const WeightView wv = weight_view(w.data_as<const uint8_t>(), w.stride(0), w.stride(1), format, nb);
  const cuda::BlockWalk walk = cuda::block_walk(op, x);
  const auto launch = [&](auto tag) {
    using T = decltype(tag);
    launch_product<T>(out.data_as<T>(), x.data_as<const T>(), walk, wv, xq, format, m, n, nb, fused,
                      cuda::stream_of(call));
    cuda::check_launch(op);
  };
  switch (x.dtype) {
    case DType::float32: launch(float{}); break;
    case DType::float16: launch(__half{}); break;
    case DType::bfloat16: launch(__nv_bfloat16{}); break;
    default: fail(ErrorKind::not_implemented, op, "(): cuda kernel has no ", dtype_name(x.dtype), " variant");
  }
}

OPFORGE_KERNEL(matmul_q, "cuda", (std::vector<DType>{DType::float32, DType::float16, DType::bfloat16}), run);

}  // namespace opforge::matmul_q_cuda
