// rms_norm: x / sqrt(mean(x^2, last dim) + eps) * weight.
#include "opforge/registry.h"

OPFORGE_OP(rms_norm) {
  return opforge::OpDef("rms_norm(Tensor x, Tensor weight, float eps=1e-6) -> Tensor")
      .doc("Root-mean-square normalisation over the last dimension of x, scaled by weight "
           "(shape [x.shape[-1]]). Half types are computed in float32.")
      .dtypes("x", opforge::float_dtypes())
      .same_dtype("weight", "x")
      .rank("x", 1)
      .rank("weight", 1, 1)
      .backward("rms_norm_backward", {"x", "weight"})
      .maps_over_leading_dims({"x"})
      .autocast(opforge::AutocastPolicy::fp32)
      .shape([](const opforge::ShapeContext& c) {
        c.expect_shape("weight", {c.tensor("x").size(-1)});
        if (!(c.attr_float("eps") >= 0.0))
          c.fail(opforge::ErrorKind::value, "'eps' must be >= 0, got ", c.attr_float("eps"));
        return opforge::Outputs{c.like("x")};
      });
}
