// rope: rotary position embedding with given cos/sin tables.
#include "opforge/registry.h"
#include "ops/rope/rope_tables.h"

OPFORGE_OP(rope) {
  return opforge::OpDef("rope(Tensor x, Tensor cos, Tensor sin, bool interleaved=False) -> Tensor")
      .doc("Rotary position embedding of x, shape [..., seq, heads, dim] (dim even), with tables cos and "
           "sin of shape [seq, dim/2] (cos(p * theta_i) at position p, pair i): each pair (a, b) of "
           "x[..., p, h, :] becomes (a*cos - b*sin, a*sin + b*cos). interleaved=False pairs element i "
           "with i + dim/2 (HF/llama's rotate_half); interleaved=True pairs 2i with 2i+1 (GPT-J, Meta "
           "llama). Half types are computed in float32. Differentiable in x only: the tables get no "
           "gradient (backward: rope_backward, the rotation by -theta).")
      .dtypes("x", opforge::float_dtypes())
      .same_dtype("cos", "x")
      .same_dtype("sin", "x")
      .rank("x", 3)
      .rank("cos", 2, 2)
      .rank("sin", 2, 2)
      .backward("rope_backward", {"x"})
      .maps_over_leading_dims({"x"})
      .autocast(opforge::AutocastPolicy::promote)
      .shape([](const opforge::ShapeContext& c) { return opforge::rope::rotated_like(c, "x"); });
}
