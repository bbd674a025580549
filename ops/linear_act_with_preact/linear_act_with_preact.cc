// linear_act_with_preact: linear_act's forward that also returns the pre-activation, for the
// backward (linear_act's saving forward).
#include "opforge/registry.h"
#include "ops/linear_act/declaration.h"

OPFORGE_OP(linear_act_with_preact) {
  return opforge::linear_act::forward_operands(
             "linear_act_with_preact(Tensor x, Tensor weight, Tensor? bias=None, str act='none') -> (Tensor, Tensor)")
      .doc("(linear_act(x, weight, bias, act), z) with z = x @ weight^T + bias, the pre-activation, both "
           "[..., n] in x's dtype, from one product. Adapters run it in place of linear_act when a gradient "
           "will be needed and hand z to linear_act_backward, which then skips recomputing the product.")
      .shape([](const opforge::ShapeContext& c) {
        const auto shape = opforge::linear_act::checked_result_shape(c);
        return opforge::Outputs{{c.tensor("x").dtype, shape}, {c.tensor("x").dtype, shape}};
      });
}
