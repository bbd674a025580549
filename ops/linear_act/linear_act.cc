// linear_act: act(x @ weight^T + bias), fused.
#include <string>

#include "opforge/registry.h"

OPFORGE_OP(linear_act) {
  return opforge::OpDef("linear_act(Tensor x, Tensor weight, Tensor? bias=None, str act='none') -> Tensor")
      .doc("act(x @ weight^T + bias) for x [..., k], weight [n, k] and an optional bias [n] (the layout of "
           "torch.nn.functional.linear); result [..., n]. act: 'none', 'relu', 'gelu' (exact erf form), "
           "'gelu_tanh' (tanh approximation) or 'silu'. The CPU kernel is a blocked SIMD matrix product "
           "whose epilogue adds the bias and applies act to each output tile while it is in cache; half "
           "types are computed in float32; results do not depend on the thread count.")
      .dtypes("x", opforge::float_dtypes())
      .same_dtype("weight", "x")
      .same_dtype("bias", "x")
      .rank("x", 1)
      .rank("weight", 2, 2)
      .rank("bias", 1, 1)
      .backward("linear_act_backward", {"x", "weight", "bias"})
      .maps_over_leading_dims({"x"})
      .shape([](const opforge::ShapeContext& c) {
        const std::string& act = c.attr_str("act");
        if (act != "none" && act != "relu" && act != "gelu" && act != "gelu_tanh" && act != "silu")
          c.fail(opforge::ErrorKind::value, "'act' must be one of 'none', 'relu', 'gelu', 'gelu_tanh', 'silu', got '",
                 act, "'");
        const auto& x = c.tensor("x");
        const auto& w = c.tensor("weight");
        if (w.size(1) != x.size(-1))
          c.fail(opforge::ErrorKind::value, "'weight' must have shape [n, ", x.size(-1), "] (k = x.shape[-1] = ",
                 x.size(-1), "), got ", w.shape);
        if (c.optional_tensor("bias")) c.expect_shape("bias", {w.size(0)});
        std::vector<int64_t> shape = x.shape;
        shape.back() = w.size(0);
        return opforge::Outputs{{x.dtype, shape}};
      });
}
