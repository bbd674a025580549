// layer_norm: (x - mean) / sqrt(var + eps) * weight + bias over the last dimension.
#include "opforge/registry.h"

OPFORGE_OP(layer_norm) {
  return opforge::OpDef("layer_norm(Tensor x, Tensor weight, Tensor? bias=None, float eps=1e-5) -> Tensor")
      .doc("Layer normalisation over the last dimension of x, as torch.nn.functional.layer_norm "
           "with normalized_shape=(x.shape[-1],): (x - mean) / sqrt(var + eps) * weight + bias, "
           "var the biased variance; weight and the optional bias have shape [x.shape[-1]]. The "
           "moments are taken in two passes with the mean refined, so rows with a large mean keep "
           "their precision. Half types are computed in float32.")
      .dtypes("x", opforge::float_dtypes())
      .same_dtype("weight", "x")
      .same_dtype("bias", "x")
      .rank("x", 1)
      .rank("weight", 1, 1)
      .rank("bias", 1, 1)
      .backward("layer_norm_backward", {"x", "weight", "bias"})
      .maps_over_leading_dims({"x"})
      .autocast(opforge::AutocastPolicy::fp32)
      .shape([](const opforge::ShapeContext& c) {
        const int64_t n = c.tensor("x").size(-1);
        c.expect_shape("weight", {n});
        if (c.optional_tensor("bias")) c.expect_shape("bias", {n});
        if (!(c.attr_float("eps") >= 0.0))
          c.fail(opforge::ErrorKind::value, "'eps' must be >= 0, got ", c.attr_float("eps"));
        return opforge::Outputs{c.like("x")};
      });
}
