// silu_backward: grad * silu'(x), elementwise.
#include "opforge/registry.h"

OPFORGE_OP(silu_backward) {
  return opforge::OpDef("silu_backward(Tensor grad, Tensor x) -> Tensor")
      .doc("Gradient of silu for the cotangent grad: grad * sigmoid(x) * (1 + x * (1 - sigmoid(x))), with the limits 0 and grad at x = -inf and inf. grad and x broadcast against each other (as silu's backward they "
           "share one shape). Half types are computed in float32.")
      .dtypes("grad", opforge::float_dtypes())
      .same_dtype("x", "grad")
      .maps_over_leading_dims({"grad", "x"})
      .elementwise({"grad", "x"})
      .shape([](const opforge::ShapeContext& c) {
        return opforge::Outputs{{c.tensor("grad").dtype, c.broadcast("grad", "x")}};
      });
}
