#include "out_arrays.h"

#include <algorithm>
#include <string>
#include <utility>

#include "numpy_arrays.h"
#include "opforge/error.h"

namespace opforge::python {

namespace {

// Bytes [begin, end) that a view's elements span (empty for no elements).
std::pair<uintptr_t, uintptr_t> extent(const TensorView& t) {
  if (t.numel() == 0) return {0, 0};
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

// `out` is the elementwise input `arg` itself: the same elements, in the same order, of the same
// dtype. Elementwise kernels read each element before they write the result at its index, and
// nothing else at that index, so they may run in place (opforge.relu(x, out=x)).
bool in_place(const OpDef& op, const std::string& arg, const TensorView& input, const TensorView& out) {
  const auto& args = op.elementwise_args();
  if (std::find(args.begin(), args.end(), arg) == args.end()) return false;
  if (input.data != out.data || input.dtype != out.dtype || input.shape != out.shape) return false;
  for (int64_t d = 0; d < out.rank(); ++d)
    if (out.shape[d] > 1 && input.strides[d] != out.strides[d]) return false;
  return true;
}

// A writable view of the caller's array `value`, or a TypeError/ValueError saying why not.
TensorView writable_view(const OpDef& op, const std::string& name, nb::handle value, OutArrays& out) {
  const Framework framework = framework_of(value);
  if (framework == Framework::jax)
    fail(ErrorKind::type, op.name(), "(): '", name, "' is a JAX array, which cannot be written (JAX arrays are "
         "immutable): call it without out= and use the result");
  TensorView view;
  if (framework == Framework::numpy && numpy_view(value, view)) {
    if (!numpy_writeable(value)) fail(ErrorKind::value, op.name(), "(): '", name, "' is a read-only array");
    return view;
  }
  nb::object capsule = framework == Framework::torch ? checked_torch_capsule(op, name, value, true) : nb::object();
  out.arrays.emplace_back();
  if (!nb::try_cast(capsule.is_valid() ? nb::handle(capsule) : value, out.arrays.back(), false)) {
    nb::ndarray<nb::ro> readable;
    if (nb::try_cast(value, readable, false)) fail(ErrorKind::value, op.name(), "(): '", name, "' is a read-only array");
    if (nb::hasattr(value, "dtype") && nb::hasattr(value, "device"))
      fail(ErrorKind::type, op.name(), "(): '", name, "' is a ", python_type_name(value), " with dtype ",
           framework_dtype_name(value, "an unknown dtype"), " on ", python_str(value.attr("device")), ", which opforge cannot write to",
           framework == Framework::torch ? kOutNeedsMemory : "");
    fail(ErrorKind::type, op.name(), "(): '", name,
         "' must be a writable array (NumPy, torch, CuPy, or any DLPack or buffer-protocol object), got ",
         python_type_name(value));
  }
  const nb::ndarray<>& array = out.arrays.back();
  const nb::dlpack::dtype dtype = array.dtype();
  if (!dtype_from_dlpack({dtype.code, dtype.bits, dtype.lanes}))
    fail(ErrorKind::type, op.name(), "(): '", name, "' has dtype ", framework_dtype_name(value, "an unknown dtype"),
         ", which opforge has no kernels for");
  try {
    return view_of(array);
  } catch (const Error& e) {
    fail(e.kind(), op.name(), "(): '", name, "' has ", e.what(), kOutNeedsMemory);
  }
}

void check_against_result(const OpDef& op, const std::string& name, const TensorView& view, const OutputSpec& spec,
                          const PreparedCall& call) {
  if (view.dtype != spec.dtype)
    fail(ErrorKind::type, op.name(), "(): '", name, "' must have dtype ", dtype_name(spec.dtype), ", got ",
         dtype_name(view.dtype));
  if (view.shape != spec.shape)
    fail(ErrorKind::value, op.name(), "(): '", name, "' must have shape ", spec.shape, ", got ", view.shape);
  const Device device = device_of(call.inputs);
  if (!(view.device == device))
    fail(ErrorKind::runtime, op.name(), "(): '", name, "' is on ", device_name(view.device), " but the inputs are on ",
         device_name(device), "; all tensors must be on one device");
  // Elementwise kernels see views reordered to their single result's memory order; the others
  // write row-major results.
  const bool any_order = !op.elementwise_args().empty() && call.outputs.size() == 1;
  if (any_order ? !dense_in_some_order(view) : !view.is_contiguous())
    fail(ErrorKind::value, op.name(), "(): '", name, "' must be ",
         any_order ? "dense (every element once, in one block, in some order of its dimensions)" : "row-major (C-contiguous)",
         ", got strides ", view.strides, " for shape ", view.shape);
  for (size_t slot = 0; slot < call.inputs.tensors.size(); ++slot) {
    const auto& input = call.inputs.tensors[slot];
    if (!input || !overlaps(view, *input) || (any_order && in_place(op, op.tensor_name(slot), *input, view))) continue;
    fail(ErrorKind::value, op.name(), "(): '", name, "' shares memory with '", op.tensor_name(slot), "'; out= may ",
         any_order ? "be an elementwise input itself (in place), not overlap one otherwise"
                   : "not overlap an input (kernels may read an input after writing results)");
  }
}

}  // namespace

OutArrays out_arrays(const OpDef& op, nb::handle out, const PreparedCall& call) {
  const size_t count = call.outputs.size();
  OutArrays result;
  result.sequence = PyTuple_Check(out.ptr()) || PyList_Check(out.ptr());
  std::vector<nb::handle> given;  // borrowed from `out`, which the call holds
  if (result.sequence) {
    for (nb::handle item : nb::borrow<nb::sequence>(out)) given.push_back(item);
    if (given.size() != count)
      fail(ErrorKind::type, op.name(), "(): 'out' must hold ", count, count == 1 ? " array" : " arrays",
           " (one per result), got a ", python_type_name(out), " of ", given.size());
  } else {
    if (count != 1)
      fail(ErrorKind::type, op.name(), "(): 'out' must be a tuple of ", count, " arrays (one per result), got ",
           python_type_name(out));
    given.push_back(out);
  }
  for (size_t i = 0; i < count; ++i) {
    const std::string name = result.sequence ? str("out[", i, "]") : std::string("out");
    if (given[i].is_none()) {
      result.views.emplace_back();
      result.objects.emplace_back();
      continue;
    }
    TensorView view = writable_view(op, name, given[i], result);
    check_against_result(op, name, view, call.outputs[i], call);
    for (size_t j = 0; j < i; ++j)
      if (result.views[j] && overlaps(view, *result.views[j]))
        fail(ErrorKind::value, op.name(), "(): '", name, "' shares memory with 'out[", j, "]'");
    result.views.emplace_back(std::move(view));
    result.objects.push_back(nb::borrow(given[i]));
  }
  return result;
}

void mark_written(const OutArrays& out) {
  static PyObject* increment_version = nullptr;
  for (const nb::object& object : out.objects)
    if (object.is_valid() && framework_of(object) == Framework::torch)
      nb::handle(module_function(increment_version, "torch.autograd.graph", "increment_version"))(object);
}

}  // namespace opforge::python
