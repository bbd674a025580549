// Results that keep their inputs' layout: opforge/layout.h.
#include "opforge/layout.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "opforge/error.h"

namespace opforge {

namespace {

// Operand strides against the result's shape, by magnitude; 0 where they decide nothing
// (broadcast dimensions and the result's size-1 dimensions, whose strides are arbitrary).
Dims deciding_strides(const TensorView& t, const Dims& shape) {
  Dims s = broadcast_strides(t, shape);
  for (size_t d = 0; d < s.size(); ++d) s[d] = shape[d] == 1 ? 0 : std::llabs(s[d]);
  return s;
}

}  // namespace

Dims elementwise_result_strides(std::span<const TensorView* const> operands, const Dims& shape) {
  const size_t n = shape.size();
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  // Row-major operands (broadcast or not) order every pair row-major: the common call skips the sort.
  bool row_major = true;
  for (const TensorView* t : operands) row_major = row_major && (!t || t->is_contiguous());
  if (n < 2 || numel == 0 || row_major) return contiguous_strides(shape);
  for (const TensorView* t : operands)
    if (t && t->shape.size() > n) return contiguous_strides(shape);  // not this result's operand
  std::vector<Dims> strides;
  for (const TensorView* t : operands)
    if (t) strides.push_back(deciding_strides(*t, shape));
  // Whether dimension `inner` (placed inside `outer` so far) belongs outside it: 1 yes, -1 no,
  // 0 when no operand says. The first operand with both strides nonzero decides; equal strides
  // (overlapping memory) put the longer dimension inside.
  auto should_swap = [&](size_t inner, size_t outer) {
    for (const auto& s : strides) {
      if (s[inner] == 0 || s[outer] == 0) continue;
      if (s[inner] == s[outer]) {
        if (shape[outer] >= shape[inner]) continue;
        return 1;
      }
      return s[inner] > s[outer] ? 1 : -1;
    }
    return 0;
  };
  // order[0] is the innermost dimension. Insertion sort that leaves undecided pairs in place:
  // a dimension moves outwards past the ones it must, and stops at the first it must not.
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = n - 1 - i;
  for (size_t i = 1; i < n; ++i) {
    size_t moving = i;
    for (size_t j = i; j-- > 0;) {
      const int c = should_swap(order[j], order[moving]);
      if (c > 0) {
        std::swap(order[j], order[moving]);
        moving = j;
      } else if (c < 0) {
        break;
      }
    }
  }
  Dims out(n);
  int64_t step = 1;
  for (size_t d : order) {
    out[d] = step;
    step *= shape[d];
  }
  return out;
}

void reorder_to_result_layout(const OpDef& op, OpInputs& inputs, std::vector<TensorView>& outputs) {
  const Dims shape = outputs.front().shape;
  const Dims result_strides = outputs.front().strides;
  const size_t n = shape.size();
  // Memory order of the results, outermost first; stable, so size-1 dimensions (which tie
  // with a neighbour) keep their place.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return result_strides[a] > result_strides[b]; });
  auto permuted = [&](const Dims& sizes, const Dims& steps, TensorView& t) {
    t.shape.resize(n);
    t.strides.resize(n);
    for (size_t i = 0; i < n; ++i) {
      t.shape[i] = sizes[order[i]];
      t.strides[i] = steps[order[i]];
    }
  };
  for (TensorView& out : outputs) {
    OPFORGE_CHECK(out.shape == shape, op.name(), ": elementwise results of different shapes");
    const Dims steps = out.strides;
    permuted(shape, steps, out);
    OPFORGE_CHECK(out.is_contiguous(), op.name(), ": a result is neither row-major nor a reordering of it");
  }
  for (const std::string& arg : op.elementwise_args()) {
    auto& t = inputs.tensors[op.tensor_slot(arg)];
    if (!t) continue;
    const Dims steps = broadcast_strides(*t, shape);
    Dims sizes = shape;
    const size_t lead = n - t->shape.size();
    for (size_t d = 0; d < n; ++d)
      if (d < lead || t->shape[d - lead] == 1) sizes[d] = 1;
    permuted(sizes, steps, *t);
  }
}

}  // namespace opforge
