// relu_backward: grad * relu'(x), elementwise.
#include "opforge/registry.h"

OPFORGE_OP(relu_backward) {
  return opforge::OpDef("relu_backward(Tensor grad, Tensor x) -> Tensor")
      .doc("Gradient of relu for the cotangent grad: grad where x > 0, else 0 (0 at x = 0 as in torch and JAX; grad where x is NaN, as torch's threshold_backward). grad and x broadcast against each other (as relu's backward they "
           "share one shape). Half types are computed in float32.")
      .dtypes("grad", opforge::float_dtypes())
      .same_dtype("x", "grad")
      .maps_over_leading_dims({"grad", "x"})
      .shape([](const opforge::ShapeContext& c) {
        return opforge::Outputs{{c.tensor("grad").dtype, c.broadcast("grad", "x")}};
      });
}
