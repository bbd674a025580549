// linear_act: act(x @ weight^T + bias), fused.
#include "opforge/registry.h"
#include "ops/linear_act/declaration.h"

OPFORGE_OP(linear_act) {
  return opforge::linear_act::forward_operands(
             "linear_act(Tensor x, Tensor weight, Tensor? bias=None, str act='none') -> Tensor")
      .doc("act(x @ weight^T + bias) for x [..., k], weight [n, k] and an optional bias [n] (the layout of "
           "torch.nn.functional.linear); result [..., n]. act: 'none', 'relu', 'gelu' (exact erf form), "
           "'gelu_tanh' (tanh approximation) or 'silu'. The CPU kernel is a blocked SIMD matrix product "
           "whose epilogue adds the bias and applies act to each output tile while it is in cache; half "
           "types are computed in float32 (bfloat16 on Intel AMX tiles where the CPU has them, denormals "
           "read as zero; opforge.set_amx_enabled); results do not depend on the thread count. When a gradient will "
           "be needed, adapters run linear_act_with_preact instead, so the backward need not recompute "
           "the product.")
      .backward("linear_act_backward", {"x", "weight", "bias"})
      .saving_forward("linear_act_with_preact", {"preact"})
      .autocast(opforge::AutocastPolicy::lower_precision)
      .shape([](const opforge::ShapeContext& c) {
        return opforge::Outputs{{c.tensor("x").dtype, opforge::linear_act::checked_result_shape(c)}};
      });
}
