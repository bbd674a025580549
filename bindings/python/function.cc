#include "function.h"

#include <structmember.h>

#include <cstddef>
#include <exception>
#include <utility>

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
  const OpDef* op;        // registered ops live as long as the process
};

PyTypeObject* function_type = nullptr;
PyObject* raise_pending = nullptr;    // _core._raise_pending (kept for the process's life)
PyObject* jax_tracer_type = nullptr;  // jax.core.Tracer, once opforge.jax has loaded
thread_local std::exception_ptr pending;

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
PyObject* framework_route(const FunctionObject& function, const BoundArgs& bound) {
  PyObject* const torch_route = route_or_null(function.torch_route);
  PyObject* const jax_route = route_or_null(function.jax_route);
  if (!torch_route && !jax_route) return nullptr;
  const auto& specs = function.op->schema().args;
  bool torch_tensors = false, jax_arrays = false, other_arrays = false;
  for (size_t i = 0; i < specs.size(); ++i) {
    PyObject* const value = bound.values[i].ptr();
    if (!specs[i].is_tensor() || !value || value == Py_None) continue;
    switch (framework_of(value)) {
      case Framework::jax:
        if (jax_tracer_type && PyObject_TypeCheck(value, reinterpret_cast<PyTypeObject*>(jax_tracer_type))) {
          if (bound.out.ptr())
            fail(ErrorKind::type, function.op->name(), "(): out= cannot be used while JAX traces (jit, grad, vmap): "
                 "JAX arrays are immutable; use the result");
          return jax_route;
        }
        jax_arrays = true;
        break;
      case Framework::torch: torch_tensors = true; break;
      default: other_arrays = true;
    }
  }
  if (other_arrays || torch_tensors == jax_arrays) return nullptr;  // mixed, or no array
  // out= writes the caller's arrays: torch tensors through the op's out variant (opforge.torch),
  // anything else on the generic path (JAX arrays are immutable; it says so).
  if (bound.out.ptr()) return torch_tensors && torch_outs(bound.out) ? torch_route : nullptr;
  return torch_tensors ? torch_route : jax_route;
}

PyObject* function_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* keywords) {
  const auto& function = *reinterpret_cast<FunctionObject*>(self);
  try {
    // Bound once, by the schema, for both paths: a routed call with the wrong arguments gets the
    // same TypeError as any other.
    const BoundArgs bound = bind(*function.op, {args, static_cast<size_t>(PyVectorcall_NARGS(nargsf)), keywords});
    // The framework's function raises its own Python errors: nothing to carry across here.
    if (PyObject* route = framework_route(function, bound)) return PyObject_Vectorcall(route, args, nargsf, keywords);
    return call_op(*function.op, bound).release().ptr();
  } catch (...) {
    pending = std::current_exception();
  }
  PyObject* result = PyObject_CallNoArgs(raise_pending);  // always raises
  Py_XDECREF(result);
  return nullptr;
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
  Py_VISIT(Py_TYPE(self));
  return 0;
}

int function_clear(PyObject* self) {
  auto* function = reinterpret_cast<FunctionObject*>(self);
  Py_CLEAR(function->dict);
  Py_CLEAR(function->torch_route);
  Py_CLEAR(function->jax_route);
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
  static PyType_Slot slots[] = {
      {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
      {Py_tp_descr_get, reinterpret_cast<void*>(function_get)},
      {Py_tp_repr, reinterpret_cast<void*>(function_repr)},
      {Py_tp_traverse, reinterpret_cast<void*>(function_traverse)},
      {Py_tp_clear, reinterpret_cast<void*>(function_clear)},
      {Py_tp_dealloc, reinterpret_cast<void*>(function_dealloc)},
      {Py_tp_members, members},
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

  m.def("_set_jax_tracer_type", [](nb::handle type) {
    if (!PyType_Check(type.ptr())) fail(ErrorKind::type, "_set_jax_tracer_type: expected a type");
    Py_XSETREF(jax_tracer_type, Py_NewRef(type.ptr()));
  }, nb::arg("type"), "The type of JAX tracers (opforge.jax sets it): calls given one go to the _jax_route.");
}

nb::object make_function(const OpDef& op) {
  PyObject* self = PyType_GenericAlloc(function_type, 0);
  if (!self) throw nb::python_error();
  auto* function = reinterpret_cast<FunctionObject*>(self);
  function->vectorcall = function_call;
  function->op = &op;
  return nb::steal(self);
}

}  // namespace opforge::python
