// add_backward: the gradients of add's x and y. add broadcasts, so each operand's gradient
// is grad summed over the dimensions that operand was broadcast along, back to its shape.
#include "opforge/registry.h"

OPFORGE_OP(add_backward) {
  return opforge::OpDef("add_backward(Tensor grad, Tensor x, Tensor y, int output_mask=-1) -> (Tensor, Tensor)")
      .doc("Gradients of add(x, y): grad (the cotangent of add's result) summed over the "
           "broadcast dimensions down to x's shape and to y's shape, in grad's dtype. x and y "
           "only give shapes. Half types accumulate in float32; the sums do not depend on the "
           "thread count. output_mask: bit 0 for grad_x, bit 1 for grad_y; a result not asked for "
           "comes back empty (shape [0]), uncomputed.")
      .dtypes("grad", opforge::float_dtypes())
      .shape_only({"x", "y"})
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
