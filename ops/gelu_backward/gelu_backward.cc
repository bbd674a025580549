// gelu_backward: grad * gelu'(x), elementwise, for either form of gelu.
#include "opforge/registry.h"

OPFORGE_OP(gelu_backward) {
  return opforge::OpDef("gelu_backward(Tensor grad, Tensor x, str approximate='none') -> Tensor")
      .doc("Gradient of gelu(x, approximate) for the cotangent grad: grad * (Phi(x) + x * phi(x)) for "
           "'none' (phi the standard normal density), the derivative of the tanh form for 'tanh'; "
           "the limits 0 and grad at x = -inf and inf. grad and x broadcast against each other (as "
           "gelu's backward they share one shape). Half types are computed in float32.")
      .dtypes("grad", opforge::float_dtypes())
      .same_dtype("x", "grad")
      .maps_over_leading_dims({"grad", "x"})
      .elementwise({"grad", "x"})
      .shape([](const opforge::ShapeContext& c) {
        const std::string& approximate = c.attr_str("approximate");
        if (approximate != "none" && approximate != "tanh")
          c.fail(opforge::ErrorKind::value, "'approximate' must be 'none' or 'tanh', got '", approximate, "'");
        return opforge::Outputs{{c.tensor("grad").dtype, c.broadcast("grad", "x")}};
      });
}
