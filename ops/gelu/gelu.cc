// gelu: x * Phi(x), Phi the standard normal CDF; approximate='tanh' for the tanh form.
#include "opforge/registry.h"

OPFORGE_OP(gelu) {
  return opforge::OpDef("gelu(Tensor x, str approximate='none') -> Tensor")
      .doc("Returns x * Phi(x), elementwise, as torch.nn.functional.gelu: approximate='none' is "
           "the exact form 0.5 * x * (1 + erf(x / sqrt(2))), 'tanh' the approximation 0.5 * x * "
           "(1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))). Half types are computed in float32; "
           "no overflow at large |x| (gelu(-inf) = 0, gelu(inf) = inf).")
      .dtypes("x", opforge::float_dtypes())
      .backward("gelu_backward", {"x"})
      .maps_over_leading_dims({"x"})
      .elementwise({"x"})
      .shape([](const opforge::ShapeContext& c) {
        const std::string& approximate = c.attr_str("approximate");
        if (approximate != "none" && approximate != "tanh")
          c.fail(opforge::ErrorKind::value, "'approximate' must be 'none' or 'tanh', got '", approximate, "'");
        return opforge::Outputs{c.like("x")};
      });
}
