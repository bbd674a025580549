// What the declarations of linear_act, linear_act_with_preact and linear_act_backward share:
// the operands' dtype and rank rules, the argument checks and the result shape x.shape[:-1] + [n].
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "opforge/registry.h"

namespace opforge::linear_act {

// x (a float dtype; rank >= 1), weight [n, k] and bias [n] in x's dtype: linear_act's operands,
// declared once so its saving forward validates exactly as it does.
inline OpDef forward_operands(std::string_view schema) {
  return OpDef(schema)
      .dtypes("x", float_dtypes())
      .same_dtype("weight", "x")
      .same_dtype("bias", "x")
      .rank("x", 1)
      .rank("weight", 2, 2)
      .rank("bias", 1, 1)
      .maps_over_leading_dims({"x"});
}

// Checks act, weight [n, k] against x [..., k] and bias [n]; returns x.shape[:-1] + [n].
inline Dims checked_result_shape(const ShapeContext& c) {
  const std::string& act = c.attr_str("act");
  if (act != "none" && act != "relu" && act != "gelu" && act != "gelu_tanh" && act != "silu")
    c.fail(ErrorKind::value, "'act' must be one of 'none', 'relu', 'gelu', 'gelu_tanh', 'silu', got '", act, "'");
  const auto& x = c.tensor("x");
  const auto& w = c.tensor("weight");
  if (w.size(1) != x.size(-1))
    c.fail(ErrorKind::value, "'weight' must have shape [n, ", x.size(-1), "] (k = x.shape[-1] = ", x.size(-1),
           "), got ", w.shape);
  if (c.optional_tensor("bias")) c.expect_shape("bias", {w.size(0)});
  Dims shape = x.shape;
  shape.back() = w.size(0);
  return shape;
}

}  // namespace opforge::linear_act
