#include "function.h"

#include <structmember.h>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>

#include "arrays.h"
#include "call.h"
#include "opforge/error.h"

namespace opforge::python {

namespace {

struct FunctionObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* dict;         // __name__, __signature__, __doc__, op: set by the Python package
  PyObject* weakrefs;     // so caches keyed weakly by function (functools, frameworks) work
  PyObject* torch_route;  // opforge.torch.<op>, set when that module loads (else null)
  PyObject* jax_route;    // opforge.jax.<op>, likewise
  PyObject* jax_calls;    // dict: (tensors given, attribute values) -> jitted call (see jax_call)
  const OpDef* op;        // registered ops live as long as the process
};

PyTypeObject* function_type = nullptr;
PyObject* raise_pending = nullptr;    // _core._raise_pending (kept for the process's life)
thread_local std::exception_ptr pending;

// What opforge.jax hands over as it loads (_set_jax_hooks); all null before.
struct JaxHooks {
  PyObject* tracer_type = nullptr;    // jax.core.Tracer
  PyObject* compiled = nullptr;       // opforge.jax._compiled(name, names given, attribute items)
  PyObject* raise_typed = nullptr;    // raises a JaxRuntimeError as the other frontends' exception
  PyObject* runtime_error = nullptr;  // jax.errors.JaxRuntimeError
} jax_hooks;

bool is_tracer(PyObject* value) {
  return jax_hooks.tracer_type && PyObject_TypeCheck(value, reinterpret_cast<PyTypeObject*>(jax_hooks.tracer_type));
}

// Called in a catch block: raises the exception being handled as Python's error, through
// _raise_pending, so nanobind's translators (opforge's included) set it as for any binding.
PyObject* raise_current_exception() {
  pending = std::current_exception();
  Py_XDECREF(PyObject_CallNoArgs(raise_pending));  // always raises
  return nullptr;
}

// Python may set a route to None (or delete it): no route either way.
PyObject* route_or_null(PyObject* route) { return route == Py_None ? nullptr : route; }

// out= given as torch tensors only: one, or a tuple or list of them and None.
bool torch_outs(nb::handle out) {
  if (!PyTuple_Check(out.ptr()) && !PyList_Check(out.ptr())) return framework_of(out) == Framework::torch;
  bool any = false;
  for (nb::handle item : nb::borrow<nb::sequence>(out)) {
    if (item.is_none()) continue;
    if (framework_of(item) != Framework::torch) return false;
    any = true;
  }
  return any;
}

// The framework function that takes a call in place of the generic path, or null. A JAX
// tracer (the argument of a function under jax.jit, grad or vmap) has no memory to read, so
// any tensor argument that is one sends the call to opforge.jax.<op>; so do concrete JAX
// arrays alone, which it runs as one compiled call, 5-10x faster than the DLPack path (JAX
// makes an array of foreign memory slowly). Where every tensor argument given is a torch
// tensor, opforge.torch.<op> runs it: autograd, torch's own operator (FakeTensor, functorch,
// forge, CUDA streams), and under half the generic path's cost per call. Mixtures (torch with
// NumPy, say) and anything unrecognized stay generic.
enum class Route { generic, torch, jax_traced, jax_arrays };

Route framework_route(const FunctionObject& function, const BoundArgs& bound) {
  const bool torch_route = route_or_null(function.torch_route);
  const bool jax_route = route_or_null(function.jax_route);
  if (!torch_route && !jax_route) return Route::generic;
  const auto& specs = function.op->schema().args;
  bool torch_tensors = false, jax_arrays = false, other_arrays = false;
  for (size_t i = 0; i < specs.size(); ++i) {
    PyObject* const value = bound.values[i].ptr();
    if (!specs[i].is_tensor() || !value || value == Py_None) continue;
    switch (framework_of(value)) {
      case Framework::jax:
        if (is_tracer(value)) {
          if (bound.out.ptr())
            fail(ErrorKind::type, function.op->name(), "(): out= cannot be used while JAX traces (jit, grad, vmap): "
                 "JAX arrays are immutable; use the result");
          return jax_route ? Route::jax_traced : Route::generic;
        }
        jax_arrays = true;
        break;
      case Framework::torch: torch_tensors = true; break;
      default: other_arrays = true;
    }
  }
  if (other_arrays || torch_tensors == jax_arrays) return Route::generic;  // mixed, or no array
  // out= writes the caller's arrays: torch tensors through the op's out variant (opforge.torch),
  // anything else on the generic path (JAX arrays are immutable; it says so).
  if (bound.out.ptr()) return torch_tensors && torch_route && torch_outs(bound.out) ? Route::torch : Route::generic;
  if (torch_tensors) return torch_route ? Route::torch : Route::generic;
  return jax_route ? Route::jax_arrays : Route::generic;
}

// Concrete JAX arrays run as one jitted FFI call per op, tensors given and attribute values
// (opforge.jax._compiled). opforge.jax.<op> binds the call in Python to find it, which cost as
// much again as the jitted call itself (31-34 us against 14-19, bench_call_overhead.py on the
// 2-core VM); the call is bound here already, so it is looked up here, in a dict on the function
// keyed by a mask of the tensors given and the attributes' values. Returns the call (a new
// reference), or null where opforge.jax.<op> is to take the call (its hooks unset, or an
// attribute is a tracer). An attribute of the wrong kind fails as opforge.jax.<op> fails it
// (attr_from_python both).
nb::object jax_call(FunctionObject& function, const BoundArgs& bound) {
  if (!jax_hooks.compiled) return {};
  const OpDef& op = *function.op;
  const auto& specs = op.schema().args;
  uint64_t given = 0;
  size_t tensor = 0, attributes = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    PyObject* const value = bound.values[i].ptr();
    if (specs[i].is_tensor()) {
      if (tensor == 64) return {};  // more than a mask holds (the FFI call's own mask is 64 bits)
      if (value && value != Py_None) given |= uint64_t{1} << tensor;
      ++tensor;
    } else {
      if (value && is_tracer(value)) return {};  // opforge.jax.<op> says attributes are static
      ++attributes;
    }
  }
  // The key: the mask alone for ops without attributes (a small int: no allocation), else a
  // tuple of the mask and each attribute's value as the op reads it.
  nb::object key = nb::steal(PyLong_FromUnsignedLongLong(given));
  std::vector<std::pair<std::string_view, nb::object>> items;
  if (attributes) {
    nb::list parts;
    parts.append(key);
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].is_tensor()) continue;
      nb::handle value = bound.values[i];
      nb::object attr = nb::cast(value.ptr() ? attr_from_python(op, specs[i], value) : *specs[i].default_value);
      items.emplace_back(specs[i].name, attr);
      parts.append(attr);
    }
    key = nb::tuple(parts);
  }
  if (!function.jax_calls) function.jax_calls = PyDict_New();
  if (!function.jax_calls) throw nb::python_error();
  nb::dict calls = nb::borrow<nb::dict>(function.jax_calls);
  if (PyObject* call = PyDict_GetItemWithError(calls.ptr(), key.ptr())) return nb::borrow(call);
  if (PyErr_Occurred()) throw nb::python_error();  // an unhashable value cannot get here; be safe
  // First call with this key: opforge.jax makes (or finds) the jitted call, as its own path would.
  nb::list names;
  tensor = 0;
  for (const ArgSpec& spec : specs)
    if (spec.is_tensor() && (given >> tensor++ & 1)) names.append(nb::str(spec.name.c_str()));
  std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  nb::list sorted_items;
  for (const auto& [name, value] : items)
    sorted_items.append(nb::make_tuple(nb::str(name.data(), name.size()), value));
  nb::object call = nb::handle(jax_hooks.compiled)(op.name(), nb::tuple(names), nb::tuple(sorted_items));
  if (nb::len(calls) >= 64) calls.clear();  // bounded, as opforge.jax's own cache is
  calls[key] = call;
  return call;
}

// Runs a jitted call from jax_call on the tensors given; a kernel's error comes back typed, as
// opforge.jax.<op> raises it. Returns null with the Python error set on failure.
PyObject* run_jax_call(const FunctionObject& function, const BoundArgs& bound, nb::handle call) {
  const auto& specs = function.op->schema().args;
  std::vector<PyObject*> tensors;
  tensors.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    PyObject* const value = bound.values[i].ptr();
    if (specs[i].is_tensor() && value && value != Py_None) tensors.push_back(value);
  }
  PyObject* result = PyObject_Vectorcall(call.ptr(), tensors.data(), tensors.size(), nullptr);
  if (result || !PyErr_ExceptionMatches(jax_hooks.runtime_error)) return result;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback) PyException_SetTraceback(value, traceback);
  Py_XDECREF(type);
  Py_XDECREF(traceback);
  Py_XDECREF(PyObject_CallOneArg(jax_hooks.raise_typed, value));  // always raises
  Py_DECREF(value);
  return nullptr;
}

PyObject* function_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* keywords) {
  auto& function = *reinterpret_cast<FunctionObject*>(self);
  try {
    // Bound once, by the schema, for both paths: a routed call with the wrong arguments gets the
    // same TypeError as any other.
    const BoundArgs bound = bind(*function.op, {args, static_cast<size_t>(PyVectorcall_NARGS(nargsf)), keywords});
    // The framework's function raises its own Python errors: nothing to carry across here.
    switch (framework_route(function, bound)) {
      case Route::generic: return call_op(*function.op, bound).release().ptr();
      case Route::torch: return PyObject_Vectorcall(function.torch_route, args, nargsf, keywords);
      case Route::jax_arrays:
        if (nb::object call = jax_call(function, bound); call.is_valid()) return run_jax_call(function, bound, call);
        [[fallthrough]];
      case Route::jax_traced: return PyObject_Vectorcall(function.jax_route, args, nargsf, keywords);
    }
  } catch (...) {
    return raise_current_exception();
  }
}

// opforge.jax.<op>: calls on concrete JAX arrays alone (framework_route's rule, as for
// opforge.<op>) run their jitted call from here (jax_call); everything else (tracers, other
// arrays, out=, any error in binding) goes to the Python function opforge.jax made (its
// jax_route), which says what is wrong in its own words.
PyObject* jax_function_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* keywords) {
  auto& function = *reinterpret_cast<FunctionObject*>(self);
  PyObject* const fallback = route_or_null(function.jax_route);
  try {
    std::optional<BoundArgs> bound;
    try {
      bound = bind(*function.op, {args, static_cast<size_t>(PyVectorcall_NARGS(nargsf)), keywords});
    } catch (const Error&) {
      if (!fallback) throw;
    }
    if (bound && !bound->out.ptr() && framework_route(function, *bound) == Route::jax_arrays)
      if (nb::object call = jax_call(function, *bound); call.is_valid()) return run_jax_call(function, *bound, call);
    if (!fallback) fail(ErrorKind::runtime, function.op->name(), "(): opforge.jax has not set this function's route");
    return PyObject_Vectorcall(fallback, args, nargsf, keywords);
  } catch (...) {
    return raise_current_exception();
  }
}

// Pickled, and copied (deep or not), by name, as Python's functions are: opforge.<op> and
// opforge.jax.<op> are attributes of their modules (__module__, set by the package), so a model
// or a closure holding one survives copy.deepcopy, pickle and multiprocessing. A string from
// __reduce__ means "the global of that name"; pickle checks it finds this very object there.
PyObject* function_reduce(PyObject* self, PyObject*) {
  return PyUnicode_FromString(reinterpret_cast<FunctionObject*>(self)->op->name().c_str());
}

// Like a builtin function, it does not bind as a method; having __get__ makes inspect count
// it as a routine, so help() shows its signature.
PyObject* function_get(PyObject* self, PyObject*, PyObject*) { return Py_NewRef(self); }

PyObject* function_repr(PyObject* self) {
  const OpDef& op = *reinterpret_cast<FunctionObject*>(self)->op;
  return PyUnicode_FromFormat("<opforge function %s>", op.name().c_str());
}

int function_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* function = reinterpret_cast<FunctionObject*>(self);
  Py_VISIT(function->dict);
  Py_VISIT(function->torch_route);
  Py_VISIT(function->jax_route);
  Py_VISIT(function->jax_calls);
  Py_VISIT(Py_TYPE(self));
  return 0;
}

int function_clear(PyObject* self) {
  auto* function = reinterpret_cast<FunctionObject*>(self);
  Py_CLEAR(function->dict);
  Py_CLEAR(function->torch_route);
  Py_CLEAR(function->jax_route);
  Py_CLEAR(function->jax_calls);
  return 0;
}

void function_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  if (reinterpret_cast<FunctionObject*>(self)->weakrefs) PyObject_ClearWeakRefs(self);
  function_clear(self);
  type->tp_free(self);
  Py_DECREF(type);
}

}  // namespace

void register_function_type(nb::module_& m) {
  static PyMemberDef members[] = {
      {"__vectorcalloffset__", T_PYSSIZET, offsetof(FunctionObject, vectorcall), READONLY, nullptr},
      {"__dictoffset__", T_PYSSIZET, offsetof(FunctionObject, dict), READONLY, nullptr},
      {"__weaklistoffset__", T_PYSSIZET, offsetof(FunctionObject, weakrefs), READONLY, nullptr},
      {"_torch_route", T_OBJECT, offsetof(FunctionObject, torch_route), 0,
       "opforge.torch.<op>: takes calls whose tensor arguments are all torch tensors (None: none does)."},
      {"_jax_route", T_OBJECT, offsetof(FunctionObject, jax_route), 0,
       "opforge.jax.<op>: takes calls with a JAX tracer among the tensor arguments, or JAX arrays only "
       "(None: none does)."},
      {nullptr, 0, 0, 0, nullptr},
  };
  static PyMethodDef methods[] = {
      {"__reduce__", function_reduce, METH_NOARGS, "Pickled as a reference to the module attribute of its name."},
      {nullptr, nullptr, 0, nullptr},
  };
  static PyType_Slot slots[] = {
      {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
      {Py_tp_descr_get, reinterpret_cast<void*>(function_get)},
      {Py_tp_repr, reinterpret_cast<void*>(function_repr)},
      {Py_tp_traverse, reinterpret_cast<void*>(function_traverse)},
      {Py_tp_clear, reinterpret_cast<void*>(function_clear)},
      {Py_tp_dealloc, reinterpret_cast<void*>(function_dealloc)},
      {Py_tp_members, members},
      {Py_tp_methods, methods},
      {Py_tp_doc, const_cast<char*>("An opforge op as a function: opforge.<op>(...).")},
      {0, nullptr},
  };
  static PyType_Spec spec = {"opforge._core.Function", sizeof(FunctionObject), 0,
                             Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL, slots};
  nb::object type = nb::steal(PyType_FromSpec(&spec));
  if (!type.is_valid()) throw nb::python_error();
  function_type = reinterpret_cast<PyTypeObject*>(type.ptr());
  m.attr("Function") = type;

  // The error of a failed call, raised from inside a nanobind function.
  m.def("_raise_pending", [] {
    std::exception_ptr error = std::exchange(pending, nullptr);
    if (!error) fail(ErrorKind::runtime, "_raise_pending: no error is pending");
    std::rethrow_exception(error);
  });
  raise_pending = nb::object(m.attr("_raise_pending")).release().ptr();

  m.def("_set_jax_hooks", [](nb::handle tracer_type, nb::callable compiled, nb::callable raise_typed,
                             nb::handle runtime_error) {
    if (!PyType_Check(tracer_type.ptr()) || !PyExceptionClass_Check(runtime_error.ptr()))
      fail(ErrorKind::type, "_set_jax_hooks: expected the tracer type and an exception class");
    Py_XSETREF(jax_hooks.tracer_type, Py_NewRef(tracer_type.ptr()));
    Py_XSETREF(jax_hooks.compiled, Py_NewRef(compiled.ptr()));
    Py_XSETREF(jax_hooks.raise_typed, Py_NewRef(raise_typed.ptr()));
    Py_XSETREF(jax_hooks.runtime_error, Py_NewRef(runtime_error.ptr()));
  }, nb::arg("tracer_type"), nb::arg("compiled"), nb::arg("raise_typed"), nb::arg("runtime_error"),
     "Set by opforge.jax: calls given a tracer go to the _jax_route; calls on concrete JAX arrays run "
     "compiled(name, tensor names given, sorted attribute items)(*tensors), a runtime_error from it "
     "raised through raise_typed.");
}

nb::object make_function(const OpDef& op, bool jax_only) {
  PyObject* self = PyType_GenericAlloc(function_type, 0);
  if (!self) throw nb::python_error();
  auto* function = reinterpret_cast<FunctionObject*>(self);
  function->vectorcall = jax_only ? jax_function_call : function_call;
  function->op = &op;
  return nb::steal(self);
}

}  // namespace opforge::python
