// mul: x * y with NumPy broadcasting.
#include "opforge/registry.h"

OPFORGE_OP(mul) {
  using opforge::DType;
  return opforge::OpDef("mul(Tensor x, Tensor y) -> Tensor")
      .doc("Returns x * y, elementwise, with NumPy broadcasting. Both must share one dtype; "
           "half types multiply in float32 and round once.")
      .dtypes("x", {DType::float32, DType::float64, DType::float16, DType::bfloat16, DType::int32,
                    DType::int64})
      .same_dtype("y", "x")
      .backward("mul_backward", {"x", "y"})
      .maps_over_leading_dims({"x", "y"})
      .elementwise({"x", "y"})
      .autocast(opforge::AutocastPolicy::promote)
      .shape([](const opforge::ShapeContext& c) {
        return opforge::Outputs{{c.tensor("x").dtype, c.broadcast("x", "y")}};
      });
}
