// matmul_q: float activations times ggml-quantized weights, x @ dequantize(w)^T.
#include "opforge/cpu/ggml_quant.h"
#include "opforge/registry.h"

OPFORGE_OP(matmul_q) {
  using opforge::DType;
  namespace quant = opforge::quant;
  return opforge::OpDef("matmul_q(Tensor x, Tensor w, str format) -> Tensor")
      .doc("x @ dequantize(w, format)^T for activations x [..., k] (k a multiple of 32) and a "
           "weight matrix w of n rows in ggml's block format ('q8_0': uint8 [n, k / 32 * 34], "
           "'q4_0': [n, k / 32 * 18]); result [..., n] in x's dtype. As in ggml, x is quantized "
           "to Q8_0 per row and block (as quantize_q8_0 does), and each block pair contributes "
           "its exact int8 dot product times both fp16 scales; blocks are summed in float64 in "
           "order, then rounded once, so every SIMD path gives the same bits. Not "
           "differentiable.")
      .dtypes("x", {DType::float32, DType::float16, DType::bfloat16})
      .dtypes("w", {DType::uint8})
      .rank("x", 1)
      .rank("w", 2, 2)
      .maps_over_leading_dims({"x"})
      .autocast(opforge::AutocastPolicy::lower_precision)
      .shape([](const opforge::ShapeContext& c) {
        const quant::Format format = quant::format_of(c);
        const auto& x = c.tensor("x");
        const auto& w = c.tensor("w");
        const int64_t k = x.size(-1);
        if (k % quant::kBlock != 0)
          c.fail(opforge::ErrorKind::value, "'x' last dimension must be a multiple of 32, got ", k);
        const int64_t row_bytes = k / quant::kBlock * quant::block_bytes(format);
        if (w.size(1) != row_bytes)
          c.fail(opforge::ErrorKind::value, "'w' must have shape [n, ", row_bytes, "] (k / 32 * ",
                 quant::block_bytes(format), " bytes per row for format '", quant::format_name(format),
                 "' and k = ", k, "), got ", w.shape);
        opforge::Dims shape = x.shape;
        shape.back() = w.size(0);
        return opforge::Outputs{{x.dtype, shape}};
      });
}
