// add_one: x + 1, elementwise. The smallest complete op: a template to copy.
#include "opforge/registry.h"

OPFORGE_OP(add_one) {
  using opforge::DType;
  return opforge::OpDef("add_one(Tensor x) -> Tensor")
      .doc("Returns x + 1, elementwise, in x's dtype.")
      .dtypes("x", {DType::float32, DType::float64, DType::float16, DType::bfloat16, DType::int32,
                    DType::int64})
      .backward("add_one_backward", {"x"})
      .identity_gradient({"x"})
      .maps_over_leading_dims({"x"})
      .elementwise({"x"})
      .shape([](const opforge::ShapeContext& c) { return opforge::Outputs{c.like("x")}; });
}
