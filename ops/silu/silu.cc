// silu: x * sigmoid(x), elementwise.
#include "opforge/registry.h"

OPFORGE_OP(silu) {
  return opforge::OpDef("silu(Tensor x) -> Tensor")
      .doc("Returns x * sigmoid(x), elementwise (SiLU, swish). Half types are computed in float32; no overflow at large |x| (silu(-inf) = 0, silu(inf) = inf).")
      .dtypes("x", opforge::float_dtypes())
      .backward("silu_backward", {"x"})
      .maps_over_leading_dims({"x"})
      .elementwise({"x"})
      .shape([](const opforge::ShapeContext& c) { return opforge::Outputs{c.like("x")}; });
}
