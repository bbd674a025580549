// add: x + y with NumPy broadcasting.
#include "opforge/registry.h"

OPFORGE_OP(add) {
  using opforge::DType;
  return opforge::OpDef("add(Tensor x, Tensor y) -> Tensor")
      .doc("Returns x + y, elementwise, with NumPy broadcasting. Both must share one dtype.")
      .dtypes("x", {DType::float32, DType::float64, DType::float16, DType::bfloat16, DType::int32,
                    DType::int64})
      .same_dtype("y", "x")
      .backward("add_backward", {"x", "y"})
      .identity_gradient({"x", "y"})  // where an operand does not broadcast
      .maps_over_leading_dims({"x", "y"})
      .elementwise({"x", "y"})
      .autocast(opforge::AutocastPolicy::promote)
      .shape([](const opforge::ShapeContext& c) {
        return opforge::Outputs{{c.tensor("x").dtype, c.broadcast("x", "y")}};
      });
}
