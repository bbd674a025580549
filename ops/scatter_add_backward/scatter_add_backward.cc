// scatter_add_backward: the gradient of scatter_add with respect to src, a gather along dim:
// grad_src[..., i, ...] = grad[..., index[i], ...]. index gets no gradient.
#include "opforge/registry.h"
#include "ops/scatter_add/scatter_layout.h"

OPFORGE_OP(scatter_add_backward) {
  using opforge::DType;
  return opforge::OpDef("scatter_add_backward(Tensor grad, Tensor index, int dim=0) -> Tensor")
      .doc("Gradient of scatter_add for the cotangent grad of its result: grad_src[..., i, ...] = "
           "grad[..., index[i], ...] along dim (a gather); the result has grad's shape with shape[dim] = "
           "len(index). A value of index outside [0, grad.shape[dim]) is a ValueError naming it and its "
           "position.")
      .dtypes("grad", opforge::float_dtypes())
      .dtypes("index", {DType::int32, DType::int64})
      .rank("grad", 1)
      .rank("index", 1, 1)
      .validates({"index"})
      .shape([](const opforge::ShapeContext& c) {
        const int64_t dim = opforge::scatter::checked_dim(c, "grad");
        opforge::OutputSpec out = c.like("grad");
        out.shape[dim] = c.tensor("index").shape[0];
        return opforge::Outputs{out};
      });
}
