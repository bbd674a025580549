// relu_backward: grad * relu'(x), elementwise, read from relu's result: relu keeps exactly the
// positive inputs, so result > 0 where x > 0. Taking the result (as torch's ReluBackward saves it)
// lets autograd free relu's input, and changing that input in place later is no error.
#include "opforge/registry.h"

OPFORGE_OP(relu_backward) {
  return opforge::OpDef("relu_backward(Tensor grad, Tensor result) -> Tensor")
      .doc("Gradient of relu for the cotangent grad, from relu's result: grad where result > 0, else 0 (the "
           "same as where relu's x > 0; 0 at x = 0 as in torch and JAX; grad where x is NaN, as torch's "
           "threshold_backward). grad and result broadcast against each other (as relu's backward they share "
           "one shape). Half types are computed in float32.")
      .dtypes("grad", opforge::float_dtypes())
      .same_dtype("result", "grad")
      .maps_over_leading_dims({"grad", "result"})
      .elementwise({"grad", "result"})
      .shape([](const opforge::ShapeContext& c) {
        return opforge::Outputs{{c.tensor("grad").dtype, c.broadcast("grad", "result")}};
      });
}
