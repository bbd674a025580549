// softmax_backward: the gradient of y = softmax(x) for the cotangent grad, from y itself:
// grad_x = y * (grad - sum(grad * y, last dim)).
#include "opforge/registry.h"

OPFORGE_OP(softmax_backward) {
  return opforge::OpDef("softmax_backward(Tensor grad, Tensor result) -> Tensor")
      .doc("Gradient of softmax(x) for the cotangent grad, given softmax's result y: "
           "y * (grad - sum(grad * y, -1)). Leading dimensions broadcast (rows are independent); "
           "the last dimensions must match. Half types are computed in float32.")
      .dtypes("grad", opforge::float_dtypes())
      .same_dtype("result", "grad")
      .rank("grad", 1)
      .rank("result", 1)
      .maps_over_leading_dims({"grad", "result"})
      .shape([](const opforge::ShapeContext& c) {
        const auto& grad = c.tensor("grad");
        const auto& result = c.tensor("result");
        if (grad.size(-1) != result.size(-1))
          c.fail(opforge::ErrorKind::value, "'grad' and 'result' must have the same last dimension, got shapes ",
                 grad.shape, " and ", result.shape);
        return opforge::Outputs{{grad.dtype, c.broadcast("grad", "result")}};
      });
}
