// quantize_q4_0: float rows to ggml's Q4_0 blocks (fp16 scale, 32 4-bit quants), byte for byte.
#include "opforge/cpu/ggml_quant.h"
#include "opforge/registry.h"

OPFORGE_OP(quantize_q4_0) {
  using opforge::DType;
  return opforge::OpDef("quantize_q4_0(Tensor x) -> Tensor")
      .doc("Quantizes the last dimension of x (a multiple of 32) to ggml's Q4_0 format: per block "
           "of 32 values an fp16 scale d = max / -8, max the first value of largest magnitude "
           "(2 bytes, little-endian), then 16 bytes of 4-bit quants q = min(15, trunc(x / d + 8.5)), "
           "byte j holding element j in its low nibble and element j + 16 in its high nibble; "
           "value (q - 8) * d. uint8 result of shape [..., k / 32 * 18], byte-identical to ggml's "
           "reference quantizer. Blocks holding NaN or inf give unspecified bytes (as in ggml). "
           "Not differentiable.")
      .dtypes("x", {DType::float32, DType::float16, DType::bfloat16})
      .rank("x", 1)
      .maps_over_leading_dims({"x"})
      .shape([](const opforge::ShapeContext& c) {
        const auto& x = c.tensor("x");
        const int64_t k = x.size(-1);
        if (k % opforge::quant::kBlock != 0)
          c.fail(opforge::ErrorKind::value, "'x' last dimension must be a multiple of 32, got ", k);
        opforge::Dims shape = x.shape;
        shape.back() = k / opforge::quant::kBlock * opforge::quant::block_bytes(opforge::quant::Format::q4_0);
        return opforge::Outputs{{DType::uint8, shape}};
      });
}
