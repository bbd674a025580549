// linear_act_backward: the gradients of linear_act(x, weight, bias, act) for the cotangent grad.
#include "opforge/registry.h"
#include "ops/linear_act/declaration.h"

OPFORGE_OP(linear_act_backward) {
  return opforge::OpDef(
             "linear_act_backward(Tensor grad, Tensor x, Tensor weight, Tensor? bias=None, Tensor? preact=None, "
             "str act='none', int output_mask=-1) -> (Tensor, Tensor, Tensor)")
      .doc("Gradients of linear_act(x, weight, bias, act) for the cotangent grad [..., n]: (grad_x, "
           "grad_weight, grad_bias). With z = x @ weight^T + bias (preact, as linear_act_with_preact saved it, "
           "or recomputed when preact is None) and g = grad * act'(z): grad_x = g @ weight, grad_weight = "
           "g^T @ x over all leading dims, grad_bias = the sum of g over them. grad_bias has shape [n] also "
           "without a bias. output_mask: bit 0 for grad_x, 1 for grad_weight, 2 for grad_bias; a result not "
           "asked for comes back empty (shape [0]), uncomputed (the adapters ask for the gradients autograd "
           "wants). Half types are computed in float32, g too (on Intel AMX tiles: g in two bfloat16 parts, hi + "
           "lo, as on CUDA). On the CPU, opforge.set_bf16_grad_rounding_enabled(True) (or "
           "OPFORGE_BF16_GRAD_ROUNDING=1) rounds a bfloat16 g to bfloat16 first, as torch and JAX do, and the "
           "products run as bfloat16 products (AVX512_BF16 dot products, AMX tiles), about twice as fast; with "
           "act='none', g is grad and always goes in as it is. Results do not depend on the thread count.")
      .dtypes("grad", opforge::float_dtypes())
      .same_dtype("x", "grad")
      .same_dtype("weight", "grad")
      .same_dtype("bias", "grad")
      .same_dtype("preact", "grad")
      .rank("x", 1)
      .rank("weight", 2, 2)
      .rank("bias", 1, 1)
      .shape([](const opforge::ShapeContext& c) {
        const auto grad_shape = opforge::linear_act::checked_result_shape(c);
        c.expect_shape("grad", grad_shape);
        if (c.optional_tensor("preact")) c.expect_shape("preact", grad_shape);
        const auto& w = c.tensor("weight");
        return opforge::Outputs{c.like("x"), c.like("weight"), {c.tensor("x").dtype, {w.size(0)}}};
      });
}
