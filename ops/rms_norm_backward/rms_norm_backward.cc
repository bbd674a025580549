// rms_norm_backward: the gradients of rms_norm(x, weight, eps) = x * inv * weight, with
// inv = 1 / sqrt(mean(x^2, last dim) + eps), for the cotangent grad of its result.
#include "opforge/registry.h"

OPFORGE_OP(rms_norm_backward) {
  return opforge::OpDef(
             "rms_norm_backward(Tensor grad, Tensor x, Tensor weight, float eps=1e-6, int output_mask=-1) -> "
             "(Tensor, Tensor)")
      .doc("Gradients of rms_norm(x, weight, eps) for the cotangent grad: (grad_x, grad_weight), "
           "grad_x = inv * (grad * weight - x * inv^2 * mean(grad * weight * x, -1)) and "
           "grad_weight = the sum over rows of grad * x * inv. Half types are computed in float32; "
           "grad_weight does not depend on the thread count. output_mask: bit 0 for grad_x, 1 for grad_weight; a "
           "result not asked for comes back empty (shape [0]), uncomputed.")
      .dtypes("grad", opforge::float_dtypes())
      .same_dtype("x", "grad")
      .same_dtype("weight", "grad")
      .rank("x", 1)
      .rank("weight", 1, 1)
      .shape([](const opforge::ShapeContext& c) {
        c.expect_shape("weight", {c.tensor("x").size(-1)});
        c.expect_shape("grad", c.tensor("x").shape);
        if (!(c.attr_float("eps") >= 0.0))
          c.fail(opforge::ErrorKind::value, "'eps' must be >= 0, got ", c.attr_float("eps"));
        return opforge::Outputs{c.like("x"), c.like("weight")};
      });
}
