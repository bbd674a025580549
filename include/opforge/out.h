// out=: an op's results written into tensors the caller gives instead of new ones (NumPy's
// and torch's out=). One set of rules for every frontend: the Python call's out=, torch's
// torch.ops.opforge.<op>.out overloads and their fake kernels, forge's.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "opforge/op.h"

namespace opforge {

// The arguments of the op's out variant, one per result: "out" for one, "out0", "out1", ...
// for several (an underscore in front while the op has an argument of that name). Empty for
// an op with an argument named "out": that is its own, and it has no out variant.
std::vector<std::string> out_arg_names(const OpDef& op);

// torch's schema of that variant, "<op>.out(<the op's arguments>, *, Tensor(a!) out) -> ()":
// it returns nothing, so torch.compile functionalizes it (auto_functionalized). "" if none.
std::string out_variant_schema(const OpDef& op);

// How an error names out i of n: 'out' for one result, 'out[i]' for several.
std::string out_name(size_t i, size_t n);

// The TypeError for an input or out (`name`) that needs a gradient: out= does not support
// autograd, as torch's own out= variants. Every frontend that takes torch tensors raises it.
[[noreturn]] void fail_out_needs_grad(const OpDef& op, std::string_view name);

// Checks how many outs the caller gave: a sequence (tuple or list, `type` naming its kind)
// must hold one per result; a single array is out= for an op with one result only.
void check_out_count(const OpDef& op, bool sequence, size_t given, std::string_view type);

// Checks the caller's tensors (one per result; nullopt: none given, allocate it) against the
// results the shape rule gave for `inputs`, throwing typed Errors that name the op and
// names[i]: dtype (type), shape (value), device (runtime), layout (value: row-major; any dense
// order for the single result of an elementwise op, whose kernels see views reordered to it),
// and memory shared with an input or another out (value). Sharing is allowed in one case: an
// elementwise op writing over one of its elementwise inputs, element for element (in place):
// its kernels read each element before writing the result at its index, and nothing else
// there. Views without data (a fake tensor's metadata) are not checked for sharing.
void check_out(const OpDef& op, const OpInputs& inputs, const Outputs& results,
               std::span<const std::optional<TensorView>> out, std::span<const std::string> names);

}  // namespace opforge
