// The shape rule rope and rope_backward share: `x` (or the cotangent) is [..., seq, heads,
// dim] with dim even, and cos and sin are [seq, dim / 2].
#pragma once

#include <string_view>

#include "opforge/op.h"

namespace opforge::rope {

inline Outputs rotated_like(const ShapeContext& c, std::string_view x) {
  const TensorView& t = c.tensor(x);
  const int64_t dim = t.size(-1);
  if (dim % 2 != 0)
    c.fail(ErrorKind::value, "'", x, "' must have an even last dimension (its pairs are rotated), got shape ",
           t.shape);
  c.expect_shape("cos", {t.size(-3), dim / 2});
  c.expect_shape("sin", {t.size(-3), dim / 2});
  return Outputs{c.like(x)};
}

}  // namespace opforge::rope
