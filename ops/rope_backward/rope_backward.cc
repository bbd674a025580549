// rope_backward: rope is a rotation of each pair, so its gradient rotates the cotangent back.
#include "opforge/registry.h"
#include "ops/rope/rope_tables.h"

OPFORGE_OP(rope_backward) {
  return opforge::OpDef("rope_backward(Tensor grad, Tensor cos, Tensor sin, bool interleaved=False) -> Tensor")
      .doc("Gradient of rope with respect to x for the cotangent grad ([..., seq, heads, dim]): each pair "
           "(a, b) of grad becomes (a*cos + b*sin, -a*sin + b*cos), the rotation by -theta, with the same "
           "tables and pairing as rope. The tables get no gradient.")
      .dtypes("grad", opforge::float_dtypes())
      .same_dtype("cos", "grad")
      .same_dtype("sin", "grad")
      .rank("grad", 3)
      .rank("cos", 2, 2)
      .rank("sin", 2, 2)
      .maps_over_leading_dims({"grad"})
      .shape([](const opforge::ShapeContext& c) { return opforge::rope::rotated_like(c, "grad"); });
}
