#include "function.h"

#include <structmember.h>

#include <cstddef>
#include <exception>
#include <utility>

#include "call.h"
#include "opforge/error.h"

namespace opforge::python {

namespace {

struct FunctionObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* dict;      // __name__, __signature__, __doc__, op: set by the Python package
  PyObject* weakrefs;  // so caches keyed weakly by function (functools, frameworks) work
  const OpDef* op;     // registered ops live as long as the process
};

PyTypeObject* function_type = nullptr;
PyObject* raise_pending = nullptr;  // _core._raise_pending (kept for the process's life)
thread_local std::exception_ptr pending;

PyObject* function_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* keywords) {
  const OpDef& op = *reinterpret_cast<FunctionObject*>(self)->op;
  try {
    const CallArgs call{args, static_cast<size_t>(PyVectorcall_NARGS(nargsf)), keywords};
    return call_op(op, call).release().ptr();
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
  Py_VISIT(reinterpret_cast<FunctionObject*>(self)->dict);
  Py_VISIT(Py_TYPE(self));
  return 0;
}

int function_clear(PyObject* self) {
  Py_CLEAR(reinterpret_cast<FunctionObject*>(self)->dict);
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
