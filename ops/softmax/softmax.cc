// softmax: exp(x - max) / sum(exp(x - max)) over the last dimension.
#include "opforge/registry.h"

OPFORGE_OP(softmax) {
  return opforge::OpDef("softmax(Tensor x) -> Tensor")
      .doc("Softmax over the last dimension of x, numerically stable (the row maximum is "
           "subtracted first, so large inputs do not overflow). -inf entries get 0; a row "
           "holding NaN, +inf, or only -inf gives NaN, as in torch. Half types are computed "
           "in float32.")
      .dtypes("x", opforge::float_dtypes())
      .rank("x", 1)
      .backward("softmax_backward", {"x"})
      .maps_over_leading_dims({"x"})
      .autocast(opforge::AutocastPolicy::fp32)
      .shape([](const opforge::ShapeContext& c) { return opforge::Outputs{c.like("x")}; });
}
