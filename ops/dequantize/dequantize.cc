// dequantize: ggml Q8_0 / Q4_0 blocks back to float32.
#include "opforge/cpu/ggml_quant.h"
#include "opforge/registry.h"

OPFORGE_OP(dequantize) {
  using opforge::DType;
  namespace quant = opforge::quant;
  return opforge::OpDef("dequantize(Tensor q, str format) -> Tensor")
      .doc("Expands rows of ggml quantized blocks (uint8, last dimension a multiple of the block "
           "size: 34 bytes for format 'q8_0', 18 for 'q4_0') to float32 of shape [..., blocks * "
           "32], exactly as ggml's dequantize_row: q * d (Q8_0), (q - 8) * d (Q4_0), d the block's "
           "fp16 scale. Not differentiable.")
      .dtypes("q", {DType::uint8})
      .rank("q", 1)
      .maps_over_leading_dims({"q"})
      .shape([](const opforge::ShapeContext& c) {
        const quant::Format format = quant::format_of(c);
        const auto& q = c.tensor("q");
        const int64_t bytes = quant::block_bytes(format), n = q.size(-1);
        if (n % bytes != 0)
          c.fail(opforge::ErrorKind::value, "'q' last dimension must be a multiple of ", bytes,
                 " (bytes per ", quant::format_name(format), " block), got ", n);
        opforge::Dims shape = q.shape;
        shape.back() = n / bytes * quant::kBlock;
        return opforge::Outputs{{DType::float32, shape}};
      });
}
