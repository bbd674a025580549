// mul_backward: the gradients of mul's x and y. mul broadcasts, so each operand's gradient
// is grad times the other operand, summed over the dimensions that operand was broadcast
// along, back to its shape.
#include "opforge/registry.h"

OPFORGE_OP(mul_backward) {
  return opforge::OpDef("mul_backward(Tensor grad, Tensor x, Tensor y, int output_mask=-1) -> (Tensor, Tensor)")
      .doc("Gradients of mul(x, y) for the cotangent grad of its result: (grad * y summed down to "
           "x's shape, grad * x summed down to y's shape). Half types multiply and accumulate in "
           "float32; the sums do not depend on the thread count. output_mask: bit 0 for grad_x, bit 1 for "
           "grad_y; a result not asked for comes back empty (shape [0]), uncomputed.")
      .dtypes("grad", opforge::float_dtypes())
      .same_dtype("x", "grad")
      .same_dtype("y", "grad")
      .shape([](const opforge::ShapeContext& c) {
        const auto& grad = c.tensor("grad");
        const auto& x = c.tensor("x");
        const auto& y = c.tensor("y");
        const auto expected = c.broadcast("x", "y");
        if (grad.shape != expected)
          c.fail(opforge::ErrorKind::value, "'grad' must have shape ", expected, " ('x' of shape ", x.shape,
                 " broadcast with 'y' of shape ", y.shape, "), got ", grad.shape);
        return opforge::Outputs{{grad.dtype, x.shape}, {grad.dtype, y.shape}};
      });
}
