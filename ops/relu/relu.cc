// relu: max(x, 0), elementwise.
#include "opforge/registry.h"

OPFORGE_OP(relu) {
  return opforge::OpDef("relu(Tensor x) -> Tensor")
      .doc("Returns max(x, 0), elementwise; NaN stays NaN. Half types are computed in float32.")
      .dtypes("x", opforge::float_dtypes())
      .backward("relu_backward", {"x"})
      .maps_over_leading_dims({"x"})
      .elementwise({"x"})
      .shape([](const opforge::ShapeContext& c) { return opforge::Outputs{c.like("x")}; });
}
