#include "out_arrays.h"

#include <string>

#include "numpy_arrays.h"
#include "opforge/error.h"
#include "opforge/out.h"

namespace opforge::python {

namespace {

// A writable view of the caller's array `value`, for a result of dtype `expected`, or a
// TypeError/ValueError saying why not.
TensorView writable_view(const OpDef& op, const std::string& name, DType expected, nb::handle value, OutArrays& out) {
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
    fail(ErrorKind::type, op.name(), "(): '", name, "' must have dtype ", dtype_name(expected), ", got ",
         framework_dtype_name(value, "an unknown dtype"));
  try {
    return view_of(array);
  } catch (const Error& e) {
    fail(e.kind(), op.name(), "(): '", name, "' has ", e.what(), kOutNeedsMemory);
  }
}

}  // namespace

OutArrays out_arrays(const OpDef& op, nb::handle out, const PreparedCall& call) {
  const size_t count = call.outputs.size();
  OutArrays result;
  result.sequence = PyTuple_Check(out.ptr()) || PyList_Check(out.ptr());
  std::vector<nb::handle> given;  // borrowed from `out`, which the call holds
  if (result.sequence)
    for (nb::handle item : nb::borrow<nb::sequence>(out)) given.push_back(item);
  else
    given.push_back(out);
  check_out_count(op, result.sequence, given.size(), python_type_name(out));
  std::vector<std::string> names;
  for (size_t i = 0; i < count; ++i) {
    names.push_back(result.sequence ? str("out[", i, "]") : std::string("out"));
    if (given[i].is_none()) {
      result.views.emplace_back();
      result.objects.emplace_back();
      continue;
    }
    result.views.emplace_back(writable_view(op, names.back(), call.outputs[i].dtype, given[i], result));
    result.objects.push_back(nb::borrow(given[i]));
  }
  check_out(op, call.inputs, call.outputs, result.views, names);
  return result;
}

void mark_written(const OutArrays& out) {
  static PyObject* increment_version = nullptr;
  for (const nb::object& object : out.objects)
    if (object.is_valid() && framework_of(object) == Framework::torch)
      nb::handle(module_function(increment_version, "torch.autograd.graph", "increment_version"))(object);
}

}  // namespace opforge::python
