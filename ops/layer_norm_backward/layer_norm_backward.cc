// layer_norm_backward: the gradients of layer_norm(x, weight, bias, eps) for the cotangent
// grad of its result. bias does not enter any of them, so it is not an argument; the adapters
// leave its gradient out of output_mask when the forward call had no bias.
#include "opforge/registry.h"

OPFORGE_OP(layer_norm_backward) {
  return opforge::OpDef(
             "layer_norm_backward(Tensor grad, Tensor x, Tensor weight, float eps=1e-5, int output_mask=-1) -> "
             "(Tensor, Tensor, Tensor)")
      .doc("Gradients of layer_norm(x, weight, bias, eps) for the cotangent grad: (grad_x, grad_weight, "
           "grad_bias). With xhat = (x - mean) * rstd and gw = grad * weight: grad_x = rstd * (gw - "
           "mean(gw, -1) - xhat * mean(gw * xhat, -1)), grad_weight = the sum over rows of grad * xhat, "
           "grad_bias = the sum over rows of grad. Half types are computed in float32; the sums over "
           "rows do not depend on the thread count. output_mask: bit 0 for grad_x, 1 for grad_weight, 2 for "
           "grad_bias; a result not asked for comes back empty (shape [0]), uncomputed.")
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
        return opforge::Outputs{c.like("x"), c.like("weight"), c.like("weight")};
      });
}
