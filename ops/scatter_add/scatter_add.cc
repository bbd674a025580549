// scatter_add: sums slices of src along `dim` into dim_size buckets chosen by a 1-D index,
// out[..., index[i], ...] += src[..., i, ...] starting from zeros. This is torch's index_add_
// onto zeros and jax.ops.segment_sum generalised to any dim: one index per slice, the common
// case (segment sums, message passing). torch.scatter_add's per-element index is not supported.
#include "opforge/registry.h"
#include "ops/scatter_add/scatter_layout.h"

OPFORGE_OP(scatter_add) {
  using opforge::DType;
  return opforge::OpDef("scatter_add(Tensor src, Tensor index, int dim_size, int dim=0) -> Tensor")
      .doc("Sums the slices of src along dim into dim_size buckets: out has src's shape with "
           "shape[dim] = dim_size, and out[..., j, ...] is the sum of src[..., i, ...] over the i with "
           "index[i] == j (zero where none). index is 1-D int32/int64 of length src.shape[dim]; a value "
           "outside [0, dim_size) is a ValueError naming it and its position (dim_size=0 makes every "
           "value one). Each bucket sums in increasing i, whatever the thread count (bitwise repeatable); "
           "half types accumulate in float32. Differentiable in src (backward: a gather).")
      .dtypes("src", opforge::float_dtypes())
      .dtypes("index", {DType::int32, DType::int64})
      .rank("src", 1)
      .rank("index", 1, 1)
      .validates({"index"})
      .backward("scatter_add_backward", {"src"})
      .autocast(opforge::AutocastPolicy::promote)
      .shape([](const opforge::ShapeContext& c) {
        const opforge::TensorView& src = c.tensor("src");
        const int64_t dim = opforge::scatter::checked_dim(c, "src");
        c.expect_shape("index", {src.shape[dim]});
        const int64_t dim_size = c.attr_int("dim_size");
        if (dim_size < 0) c.fail(opforge::ErrorKind::value, "'dim_size' must be >= 0, got ", dim_size);
        opforge::OutputSpec out = c.like("src");
        out.shape[dim] = dim_size;
        return opforge::Outputs{out};
      });
}
