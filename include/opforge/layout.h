// The layout of elementwise ops' results (OpDef::elementwise): the inputs' own, as torch's
// TensorIterator and NumPy's order='K' choose theirs, so a transposed or channels-last input
// gives a result laid out the same way instead of a row-major one the kernel would write
// across the grain.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "opforge/op.h"
#include "opforge/tensor.h"

namespace opforge {

// Dense strides (elements) for a result of `shape` computed from `operands` (broadcasting
// against `shape`): its dimensions ordered from the outermost to the innermost by the operands'
// strides, the first operand that orders a pair deciding it (torch's rule, so opforge's results
// have the strides torch's own elementwise ops would give). Broadcast dimensions (stride 0),
// size-1 dimensions and pairs no operand orders keep the row-major order; strides compare by
// magnitude (a NumPy array may step backwards). Row-major when every operand is.
Dims elementwise_result_strides(std::span<const TensorView* const> operands, const Dims& shape);

// For kernels of elementwise ops, which write their results row-major: the call's views with
// every dimension reordered to the results' memory order, outermost first, for results laid out
// otherwise (dense, in some order of their dimensions; run_kernel calls it for those only). The
// elementwise arguments take the results' rank (size 1, stride 0 where they broadcast); other
// tensors stay as they are.
void reorder_to_result_layout(const OpDef& op, OpInputs& inputs, std::vector<TensorView>& outputs);

}  // namespace opforge
