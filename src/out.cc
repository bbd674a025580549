#include "opforge/out.h"

#include <algorithm>
#include <utility>

#include "opforge/dispatch.h"
#include "opforge/error.h"

namespace opforge {

namespace {

// Bytes [begin, end) that a view's elements span (empty for no elements).
std::pair<uintptr_t, uintptr_t> extent(const TensorView& t) {
  if (t.numel() == 0 || !t.data) return {0, 0};
  int64_t low = 0, high = 0;
  for (int64_t d = 0; d < t.rank(); ++d) (t.strides[d] < 0 ? low : high) += (t.shape[d] - 1) * t.strides[d];
  const int64_t item = dtype_size(t.dtype);
  const auto base = reinterpret_cast<uintptr_t>(t.data);
  return {base + low * item, base + (high + 1) * item};
}

bool overlaps(const TensorView& a, const TensorView& b) {
  if (!(a.device == b.device)) return false;
  const auto [a_begin, a_end] = extent(a);
  const auto [b_begin, b_end] = extent(b);
  return a_begin < a_end && b_begin < b_end && a_begin < b_end && b_begin < a_end;
}

// Every element once, in one block, with the dimensions in some order (positive strides):
// what run_kernel reorders an elementwise op's views to (opforge/layout.h).
bool dense_in_some_order(const TensorView& t) {
  if (t.numel() == 0) return true;  // nothing to write: any strides do
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dimensions longer than 1
  for (int64_t d = 0; d < t.rank(); ++d)
    if (t.shape[d] > 1) dims.emplace_back(t.strides[d], t.shape[d]);
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

// `out` is the elementwise input `arg` itself: the same elements, in the same order, of the same dtype.
bool in_place(const OpDef& op, const std::string& arg, const TensorView& input, const TensorView& out) {
  const auto& args = op.elementwise_args();
  if (std::find(args.begin(), args.end(), arg) == args.end()) return false;
  if (input.data != out.data || input.dtype != out.dtype || input.shape != out.shape) return false;
  for (int64_t d = 0; d < out.rank(); ++d)
    if (out.shape[d] > 1 && input.strides[d] != out.strides[d]) return false;
  return true;
}

void check_one(const OpDef& op, const std::string& name, const TensorView& view, const OutputSpec& spec,
               const OpInputs& inputs, bool any_order) {
  if (view.dtype != spec.dtype)
    fail(ErrorKind::type, op.name(), "(): '", name, "' must have dtype ", dtype_name(spec.dtype), ", got ",
         dtype_name(view.dtype));
  if (view.shape != spec.shape)
    fail(ErrorKind::value, op.name(), "(): '", name, "' must have shape ", spec.shape, ", got ", view.shape);
  const Device device = device_of(inputs);
  if (!(view.device == device))
    fail(ErrorKind::runtime, op.name(), "(): '", name, "' is on ", device_name(view.device), " but the inputs are on ",
         device_name(device), "; all tensors must be on one device");
  if (any_order ? !dense_in_some_order(view) : !view.is_contiguous())
    fail(ErrorKind::value, op.name(), "(): '", name, "' must be ",
         any_order ? "dense (every element once, in one block, in some order of its dimensions)" : "row-major (C-contiguous)",
         ", got strides ", view.strides, " for shape ", view.shape);
  for (size_t slot = 0; slot < inputs.tensors.size(); ++slot) {
    const auto& input = inputs.tensors[slot];
    if (!input || !overlaps(view, *input) || (any_order && in_place(op, op.tensor_name(slot), *input, view))) continue;
    fail(ErrorKind::value, op.name(), "(): '", name, "' shares memory with '", op.tensor_name(slot), "'; out= may ",
         any_order ? "be an elementwise input itself (in place), not overlap one otherwise"
                   : "not overlap an input (kernels may read an input after writing results)");
  }
}

}  // namespace

std::vector<std::string> out_arg_names(const OpDef& op) {
  const Schema& schema = op.schema();
  if (schema.arg_index("out") >= 0) return {};
  std::vector<std::string> names;
  for (int64_t i = 0; i < schema.num_results; ++i) {
    std::string name = schema.num_results == 1 ? "out" : str("out", i);
    while (schema.arg_index(name) >= 0) name = "_" + name;
    names.push_back(std::move(name));
  }
  return names;
}

std::string out_variant_schema(const OpDef& op) {
  const std::vector<std::string> names = out_arg_names(op);
  if (names.empty()) return "";
  // The op's own argument list, as written: between the '(' after its name and the ')' before
  // the last "->" (no argument's text holds "->").
  const std::string& text = op.schema().text;
  const size_t open = text.find('('), close = text.rfind(')', text.rfind("->"));
  std::string args = text.substr(open + 1, close - open - 1);
  const bool no_args = args.find_first_not_of(" \t\n") == std::string::npos;
  std::string result = str(op.name(), ".out(", no_args ? "" : args + ", ", "*");
  for (size_t i = 0; i < names.size(); ++i) result += str(", Tensor(", static_cast<char>('a' + i), "!) ", names[i]);
  return result + ") -> ()";
}

std::string out_name(size_t i, size_t n) { return n == 1 ? std::string("out") : str("out[", i, "]"); }

void fail_out_needs_grad(const OpDef& op, std::string_view name) {
  fail(ErrorKind::type, op.name(), "(): '", name,
       "' is a torch tensor that requires grad, and out= does not support autograd (as torch's own out= variants): "
       "call it under torch.no_grad(), or without out=");
}

void check_out_count(const OpDef& op, bool sequence, size_t given, std::string_view type) {
  const auto count = static_cast<size_t>(op.schema().num_results);
  if (sequence && given != count)
    fail(ErrorKind::type, op.name(), "(): 'out' must hold ", count, count == 1 ? " array" : " arrays",
         " (one per result), got a ", type, " of ", given);
  if (!sequence && count != 1)
    fail(ErrorKind::type, op.name(), "(): 'out' must be a tuple of ", count, " arrays (one per result), got ", type);
}

void check_out(const OpDef& op, const OpInputs& inputs, const Outputs& results,
               std::span<const std::optional<TensorView>> out, std::span<const std::string> names) {
  OPFORGE_CHECK(out.size() == results.size() && names.size() == results.size(), op.name(), ": ", out.size(),
                " outs for ", results.size(), " results");
  // Elementwise kernels see views reordered to their single result's memory order; the others
  // write row-major results.
  const bool any_order = !op.elementwise_args().empty() && results.size() == 1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!out[i]) continue;
    check_one(op, names[i], *out[i], results[i], inputs, any_order);
    for (size_t j = 0; j < i; ++j)
      if (out[j] && overlaps(*out[i], *out[j]))
        fail(ErrorKind::value, op.name(), "(): '", names[i], "' shares memory with '", names[j], "'");
  }
}

}  // namespace opforge
