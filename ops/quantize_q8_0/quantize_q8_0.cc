// quantize_q8_0: float rows to ggml's Q8_0 blocks (fp16 scale, 32 int8 quants), byte for byte.
#include "opforge/cpu/ggml_quant.h"
#include "opforge/registry.h"

OPFORGE_OP(quantize_q8_0) {
  using opforge::DType;
  return opforge::OpDef("quantize_q8_0(Tensor x) -> Tensor")
      .doc("Quantizes the last dimension of x (a multiple of 32) to ggml's Q8_0 format: per block "
           "of 32 values an fp16 scale d = max|x| / 127 (2 bytes, little-endian), then 32 int8 "
           "quants roundf(x * (1 / d)), d taken before its rounding to fp16; value q * d. uint8 "
           "result of shape [..., k / 32 * 34], byte-identical to ggml's reference quantizer. "
           "Blocks holding NaN or inf give unspecified bytes (as in ggml). Not differentiable.")
      .dtypes("x", {DType::float32, DType::float16, DType::bfloat16})
      .rank("x", 1)
      .maps_over_leading_dims({"x"})
      .shape([](const opforge::ShapeContext& c) {
        const auto& x = c.tensor("x");
        const int64_t k = x.size(-1);
        if (k % opforge::quant::kBlock != 0)
          c.fail(opforge::ErrorKind::value, "'x' last dimension must be a multiple of 32, got ", k);
        opforge::Dims shape = x.shape;
        shape.back() = k / opforge::quant::kBlock * opforge::quant::block_bytes(opforge::quant::Format::q8_0);
        return opforge::Outputs{{DType::uint8, shape}};
      });
}
