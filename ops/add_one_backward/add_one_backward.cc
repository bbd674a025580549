// add_one_backward: d(x + 1)/dx is the identity, so the gradient is the cotangent itself.
// A copy, not the same array: callers may write into either without touching the other.
#include "opforge/registry.h"

OPFORGE_OP(add_one_backward) {
  return opforge::OpDef("add_one_backward(Tensor grad) -> Tensor")
      .doc("Gradient of add_one: returns a copy of grad (the cotangent of add_one's result).")
      .dtypes("grad", opforge::float_dtypes())
      .maps_over_leading_dims({"grad"})
      .elementwise({"grad"})
      .shape([](const opforge::ShapeContext& c) { return opforge::Outputs{c.like("grad")}; });
}
