#include "call.h"

#include <array>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "arrays.h"
#include "numpy_arrays.h"
#include "out_arrays.h"
#include "opforge/out.h"
#include "opforge/dispatch.h"

namespace opforge::python {

namespace {

[[noreturn]] void arg_error(const OpDef& op, const ArgSpec& arg, const char* expected, nb::handle got) {
  fail(ErrorKind::type, op.name(), "(): '", arg.name, "' must be ", expected, ", got ", python_type_name(got));
}

// An array of a dtype opforge has no kernels for (complex, uint16), named as its framework
// names it (torch's without the "torch." prefix, as the torch adapter says it).
[[noreturn]] void unsupported_dtype(const OpDef& op, const ArgSpec& spec, nb::handle value,
                                   const nb::dlpack::dtype& dtype) {
  fail_unsupported_dtype(op, spec.name, framework_dtype_name(value, str("DLPack dtype (code ", int(dtype.code),
                                                                         ", bits ", int(dtype.bits), ", lanes ",
                                                                         dtype.lanes, ")")));
}

// numpy.bool_ (named "bool" since NumPy 2, so "must be a bool, got bool" would puzzle).
bool is_numpy_bool(nb::handle value) {
  const nb::handle type(reinterpret_cast<PyObject*>(Py_TYPE(value.ptr())));
  const char* name = reinterpret_cast<PyTypeObject*>(type.ptr())->tp_name;
  return std::string_view(name) == "numpy.bool" || std::string_view(name) == "numpy.bool_";
}

}  // namespace

AttrValue attr_from_python(const OpDef& op, const ArgSpec& arg, nb::handle value) {
  const bool is_bool = PyBool_Check(value.ptr());
  switch (arg.kind) {
    case ArgKind::float_: {
      // Anything float() takes (NumPy and torch scalars too), but not a bool; an array is a
      // number to PyNumber_Check, so conversion failures are the caller's wrong argument too.
      if (is_bool || !PyNumber_Check(value.ptr())) arg_error(op, arg, "a float", value);
      const double v = PyFloat_AsDouble(value.ptr());
      if (v == -1.0 && PyErr_Occurred()) {
        const bool overflow = PyErr_ExceptionMatches(PyExc_OverflowError);
        PyErr_Clear();
        if (overflow) fail(ErrorKind::value, op.name(), "(): '", arg.name, "' is out of the float range");
        arg_error(op, arg, "a float", value);
      }
      return v;
    }
    case ArgKind::int_: {
      // Python ints and whatever has __index__ (NumPy integers), not bools or floats.
      if (is_bool || !PyIndex_Check(value.ptr())) arg_error(op, arg, "an int", value);
      int overflow = 0;
      nb::object index = nb::steal(PyNumber_Index(value.ptr()));
      const long long v = index ? PyLong_AsLongLongAndOverflow(index.ptr(), &overflow) : -1;
      if (!index || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        arg_error(op, arg, "an int", value);
      }
      if (overflow)
        fail(ErrorKind::value, op.name(), "(): '", arg.name, "' must fit in 64 bits, got ", python_str(index));
      return static_cast<int64_t>(v);
    }
    case ArgKind::bool_:
      if (is_numpy_bool(value)) return PyObject_IsTrue(value.ptr()) == 1;
      if (!is_bool) arg_error(op, arg, "a bool", value);
      return value.ptr() == Py_True;
    case ArgKind::str: {
      if (!PyUnicode_Check(value.ptr())) arg_error(op, arg, "a str", value);
      Py_ssize_t length = 0;
      const char* text = PyUnicode_AsUTF8AndSize(value.ptr(), &length);
      if (!text) {  // a lone surrogate has no UTF-8 form
        PyErr_Clear();
        fail(ErrorKind::value, op.name(), "(): '", arg.name, "' is not valid Unicode text (it has a lone surrogate)");
      }
      return std::string(text, static_cast<size_t>(length));
    }
    default:
      break;
  }
  fail(ErrorKind::runtime, "attr_from_python: not an attribute");
}

BoundArgs bind(const OpDef& op, const CallArgs& args) {
  const auto& specs = op.schema().args;
  if (args.positional > specs.size())
    fail(ErrorKind::type, op.name(), "() takes ", specs.size(), " arguments but ", args.positional, " were given");
  BoundArgs bound{std::vector<nb::handle>(specs.size()), nb::handle()};
  std::vector<nb::handle>& values = bound.values;
  for (size_t i = 0; i < args.positional; ++i) values[i] = args.values[i];
  const size_t keywords = args.keywords ? static_cast<size_t>(PyTuple_GET_SIZE(args.keywords)) : 0;
  for (size_t k = 0; k < keywords; ++k) {
    Py_ssize_t length = 0;
    const char* text = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(args.keywords, k), &length);
    if (!text) throw nb::python_error();
    const std::string_view name(text, static_cast<size_t>(length));
    const int64_t i = op.schema().arg_index(name);
    if (i < 0 && name == "out") {  // None: no out=, as NumPy reads it
      if (args.values[args.positional + k] != Py_None) bound.out = args.values[args.positional + k];
      continue;
    }
    if (i < 0) fail(ErrorKind::type, op.name(), "() got an unexpected keyword argument '", name, "'");
    if (values[i].ptr()) fail(ErrorKind::type, op.name(), "() got multiple values for argument '", name, "'");
    values[i] = args.values[args.positional + k];
  }
  for (size_t i = 0; i < specs.size(); ++i)
    if (!values[i].ptr() && !specs[i].has_default())
      fail(ErrorKind::type, op.name(), "() missing required argument '", specs[i].name, "'");
  return bound;
}

nb::object checked_torch_capsule(const OpDef& op, std::string_view name, nb::handle value, bool writes_out) {
  // to_dlpack (ours for CPU tensors, nanobind's fallback for others) exports a tensor that
  // requires grad, or has its negative bit set, anyway: the result would silently carry no
  // gradient or the wrong sign.
  static PyObject* is_grad_enabled = nullptr;
  if (nb::cast<bool>(value.attr("requires_grad")) &&
      nb::cast<bool>(nb::handle(module_function(is_grad_enabled, "torch", "is_grad_enabled"))())) {
    if (writes_out) fail_out_needs_grad(op, name);
    fail(ErrorKind::type, op.name(), "(): '", name,
         "' is a torch tensor that requires grad; the DLPack path that arrays of mixed kinds take carries "
         "no autograd: call .detach() first, or pass torch tensors only (then opforge.torch.", op.name(),
         " runs, with autograd)");
  }
  // (The conjugate bit exists only on complex tensors, which the dtype check refuses.)
  if (nb::cast<bool>(value.attr("is_neg")()))
    fail(ErrorKind::type, op.name(), "(): '", name,
         "' is a torch tensor with its negative bit set (a lazy negation); call .resolve_neg() first");
  return torch_cpu_capsule(value);
}

CallArgs call_args(const nb::args& args, const nb::kwargs& kwargs, CallArgsStorage& storage) {
  for (nb::handle value : args) storage.values.push_back(value.ptr());
  nb::list names;
  for (auto [name, value] : kwargs) {
    names.append(name);
    storage.values.push_back(value.ptr());
  }
  storage.keywords = nb::tuple(names);
  return {storage.values.data(), args.size(), storage.keywords.ptr()};
}

PreparedCall prepare_call(const OpDef& op, const BoundArgs& bound_args) {
  const std::vector<nb::handle>& bound = bound_args.values;
  const bool writes_out = bound_args.out.ptr() != nullptr;
  const auto& specs = op.schema().args;
  PreparedCall call{OpInputs::reserved_for(op.schema())};
  OpInputs& inputs = call.inputs;
  bool have_framework = false;
  for (size_t i = 0; i < specs.size(); ++i) {
    const ArgSpec& spec = specs[i];
    nb::handle value = bound[i];
    if (!spec.is_tensor()) {
      inputs.attrs.push_back(value.ptr() ? attr_from_python(op, spec, value) : *spec.default_value);
      continue;
    }
    if (!value.ptr() || value.is_none()) {
      if (spec.kind == ArgKind::tensor) arg_error(op, spec, "an array", value.ptr() ? value : nb::none());
      inputs.tensors.emplace_back(std::nullopt);
      continue;
    }
    const Framework framework = framework_of(value);
    if (!have_framework) {
      call.framework = framework;
      have_framework = true;
    }
    if (framework == Framework::numpy) {
      TensorView view;
      if (numpy_view(value, view)) {
        inputs.tensors.emplace_back(std::move(view));
        continue;
      }
    }
    // A torch CPU tensor is imported from to_dlpack's capsule (checked first); others directly.
    nb::object capsule =
        framework == Framework::torch ? checked_torch_capsule(op, spec.name, value, writes_out) : nb::object();
    nb::handle source = capsule.is_valid() ? nb::handle(capsule) : value;
    call.arrays.emplace_back();
    if (!import_array(source, call.arrays.back())) {
      // An array DLPack cannot express (byte order, dtype, device) is still an array: say which.
      if (nb::hasattr(value, "dtype") && nb::hasattr(value, "device"))
        fail(ErrorKind::type, op.name(), "(): '", spec.name, "' is a ", python_type_name(value), " with dtype ",
             python_str(value.attr("dtype")), " on ", python_str(value.attr("device")),
             ", which opforge cannot read without a copy",
             writes_out ? kOutNeedsMemory : "");
      arg_error(op, spec, "an array (NumPy, torch, JAX, CuPy, or any DLPack or buffer-protocol object)", value);
    }
    const nb::dlpack::dtype dtype = call.arrays.back().dtype();
    if (!dtype_from_dlpack({dtype.code, dtype.bits, dtype.lanes})) unsupported_dtype(op, spec, value, dtype);
    try {
      inputs.tensors.emplace_back(view_of(call.arrays.back()));
    } catch (const Error& e) {
      // e.g. a device DLPack has, opforge not
      fail(e.kind(), op.name(), "(): '", spec.name, "' has ", e.what(), writes_out ? kOutNeedsMemory : "");
    }
    // A JAX GPU array may still be computing on a stream we cannot see: wait for it.
    if (inputs.tensors.back()->device.type == DeviceType::cuda && framework == Framework::jax)
      value.attr("block_until_ready")();
  }
  call.outputs = infer_outputs(op, inputs);
  call.selection = select_kernel(op, inputs);
  return call;
}

namespace {

// Sizes or strides from Python (a tuple, a list, a torch.Size), and back as a tuple. Trace time
// only (JAX abstract evaluation, fake kernels): a vector's conversions do.
Dims dims_from(nb::handle sequence) { return nb::cast<std::vector<int64_t>>(sequence); }
nb::tuple dims_to_python(const Dims& dims) { return nb::tuple(nb::cast(dims.vec())); }

// A tensor's metadata, (shape, dtype[, (device type, index)[, strides]]), as a view without data.
// `result`: the result this one is to hold (an out), named in a dtype error.
TensorView view_from_meta(const OpDef& op, const std::string& name, nb::handle meta, const OutputSpec* result = nullptr) {
  TensorView view;
  view.shape = dims_from(meta[0]);
  const std::string dtype = nb::cast<std::string>(meta[1]);
  try {
    view.dtype = dtype_from_name(dtype);
  } catch (const Error&) {
    if (result)
      fail(ErrorKind::type, op.name(), "(): '", name, "' must have dtype ", dtype_name(result->dtype), ", got ", dtype);
    fail_unsupported_dtype(op, name, dtype);
  }
  // Strides default to row-major.
  view.strides = nb::len(meta) > 3 && !meta[3].is_none() ? dims_from(meta[3])
                                                          : contiguous_strides(view.shape);
  if (view.strides.size() != view.shape.size())
    fail(ErrorKind::value, op.name(), "(): '", name, "' has ", view.shape.size(), " sizes but ", view.strides.size(),
         " strides");
  if (nb::len(meta) > 2 && !meta[2].is_none()) {  // (device type name, index): checks devices agree
    const std::string type = nb::cast<std::string>(meta[2][0]);
    if (type != "cpu" && type != "cuda") fail(ErrorKind::runtime, op.name(), "(): unknown device type '", type, "'");
    view.device = Device{type == "cuda" ? DeviceType::cuda : DeviceType::cpu, nb::cast<int32_t>(meta[2][1])};
  }
  return view;
}

}  // namespace

nb::list infer_call(const OpDef& op, const nb::sequence& tensors, const nb::dict& attrs, nb::handle out) {
  OpInputs inputs = OpInputs::reserved_for(op.schema());
  const auto& specs = op.schema().args;
  size_t t = 0;
  for (const ArgSpec& spec : specs) {
    if (spec.is_tensor()) {
      nb::handle meta = tensors[t++];
      if (meta.is_none())
        inputs.tensors.emplace_back(std::nullopt);
      else
        inputs.tensors.emplace_back(view_from_meta(op, spec.name, meta));
    } else if (attrs.contains(spec.name.c_str())) {
      inputs.attrs.push_back(attr_from_python(op, spec, attrs[spec.name.c_str()]));
    } else if (spec.default_value) {
      inputs.attrs.push_back(*spec.default_value);
    } else {
      fail(ErrorKind::type, op.name(), "() missing required argument '", spec.name, "'");
    }
  }
  const Outputs results = infer_outputs(op, inputs);
  if (!out.is_none()) {  // metadata of out= tensors, one per result (None: not given)
    const nb::sequence metas = nb::borrow<nb::sequence>(out);
    OPFORGE_CHECK(nb::len(metas) == results.size(), op.name(), ": ", nb::len(metas), " outs for ", results.size(),
                  " results");
    std::vector<std::optional<TensorView>> views;
    std::vector<std::string> names;
    for (size_t i = 0; i < results.size(); ++i) {
      names.push_back(out_name(i, results.size()));
      if (metas[i].is_none())
        views.emplace_back();
      else
        views.emplace_back(view_from_meta(op, names.back(), metas[i], &results[i]));
    }
    check_out(op, inputs, results, views, names);
  }
  nb::list list;
  for (const OutputSpec& o : results)
    list.append(nb::make_tuple(dims_to_python(o.shape), std::string(dtype_name(o.dtype)), dims_to_python(o.strides)));
  return list;
}

nb::object call_op(const OpDef& op, const BoundArgs& bound) {
  const PreparedCall call = prepare_call(op, bound);
  const OpInputs& inputs = call.inputs;
  const Selection& selection = call.selection;
  const Outputs& specs_out = call.outputs;
  const Framework framework = call.framework;
  const Device device = device_of(inputs);
  void* stream = current_stream(framework, device);
  const OutArrays given = bound.out.ptr() ? out_arrays(op, bound.out, call) : OutArrays{};
  std::vector<std::optional<Allocation>> results(specs_out.size());  // those not given by out=
  // Small NumPy results, in NumPy's memory (numpy_small_result); inline for up to four.
  std::array<nb::object, 4> small_inline;
  std::vector<nb::object> small_heap(specs_out.size() > small_inline.size() ? specs_out.size() : 0);
  nb::object* const small = small_heap.empty() ? small_inline.data() : small_heap.data();
  std::vector<TensorView> views;
  views.reserve(specs_out.size());
  try {
    for (size_t i = 0; i < specs_out.size(); ++i) {
      if (!given.views.empty() && given.views[i]) {
        views.push_back(*given.views[i]);
        continue;
      }
      const OutputSpec& out = specs_out[i];
      if (framework == Framework::numpy && device.type == DeviceType::cpu) {
        TensorView view;
        small[i] = numpy_small_result(out.dtype, out.shape, out.strides, view);
        if (small[i].is_valid()) {
          views.push_back(std::move(view));
          continue;
        }
      }
      // JAX arrays are row-major whatever the inputs' layout (another framework's input can lead).
      const auto strides = framework == Framework::jax ? contiguous_strides(out.shape) : out.strides;
      results[i] = allocate(*selection.backend, out.dtype, out.shape, strides, device, stream);
      views.push_back(results[i]->view);
    }
  } catch (const Error& error) {
    fail_result_allocation(op, error);
  }
  {
    nb::gil_scoped_release no_gil;  // kernels may run long and use the thread pool
    const bool waits = device.type == DeviceType::cuda && synchronizes_on_return(framework);
    // Results freed while the kernel may still write them (an error, or the caller dropping
    // them early) must wait for it: stream-ordered memory is not freed in order on its own.
    auto fence_results = [&] {
      if (device.type == DeviceType::cuda && !waits)
        for (const auto& r : results)
          if (r) r->fence(stream);
    };
    try {
      run_kernel(op, selection, inputs, views, stream);
    } catch (...) {
      try {
        fence_results();
      } catch (...) {  // the kernel's error is the one to report
      }
      throw;
    }
    fence_results();
    if (waits) selection.backend->synchronize(device, stream);
  }
  if (bound.out.ptr()) mark_written(given);
  auto result = [&](size_t i) {
    if (!given.objects.empty() && given.objects[i].is_valid()) return given.objects[i];
    return small[i].is_valid() ? small[i] : wrap(*results[i], framework);
  };
  // One result: the array itself, unless out= came as a tuple (NumPy's ufuncs answer alike).
  if (results.size() == 1 && !given.sequence) return result(0);
  nb::list out;
  for (size_t i = 0; i < results.size(); ++i) out.append(result(i));
  return nb::tuple(out);
}

}  // namespace opforge::python
