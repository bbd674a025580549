// linear_act_backward: the gradients of linear_act(x, weight, bias, act) for the cotangent grad.
#include <string>

#include "opforge/registry.h"

OPFORGE_OP(linear_act_backward) {
  return opforge::OpDef(
             "linear_act_backward(Tensor grad, Tensor x, Tensor weight, Tensor? bias=None, str act='none') "
             "-> (Tensor, Tensor, Tensor)")
      .doc("Gradients of linear_act(x, weight, bias, act) for the cotangent grad [..., n]: (grad_x, "
           "grad_weight, grad_bias). With z = x @ weight^T + bias recomputed (not saved by the forward) and "
           "g = grad * act'(z): grad_x = g @ weight, grad_weight = g^T @ x over all leading dims, grad_bias = "
           "the sum of g over them. grad_bias has shape [n] also without a bias (the adapters drop it). Half "
           "types are computed in float32; results do not depend on the thread count.")
      .dtypes("grad", opforge::float_dtypes())
      .same_dtype("x", "grad")
      .same_dtype("weight", "grad")
      .same_dtype("bias", "grad")
      .rank("x", 1)
      .rank("weight", 2, 2)
      .rank("bias", 1, 1)
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
        std::vector<int64_t> grad_shape = x.shape;
        grad_shape.back() = w.size(0);
        c.expect_shape("grad", grad_shape);
        return opforge::Outputs{c.like("x"), c.like("weight"), {x.dtype, {w.size(0)}}};
      });
}
