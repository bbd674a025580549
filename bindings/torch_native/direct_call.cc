// The direct call behind opforge.torch.<op>(...): plain CPU tensors go from Python straight to
// opforge's validator and kernel, without torch's dispatcher (whose Python entry alone costs
// more than a native aten call). Plain CPU tensors that need a gradient go to the dispatcher
// from here, boxed (its autograd kernel, autograd.cc, records the graph), which skips the torch
// op's Python entry and argument parsing. Everything else takes the torch op, unchanged: tensor
// subclasses and FakeTensors, functorch wrappers, active dispatch modes and torch function
// modes, CUDA tensors (their stream handling lives in the stable adapter), dtypes opforge lacks,
// forward-AD dual tensors, ops with a cast policy under torch.autocast.
// Uses torch's Python C++ API (THPVariable), so it lives in the torch-version-specific library.
#include <Python.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings/torch_native/cpu_direct.h"
#include "opforge/registry.h"

#define OPFORGE_TORCH_EXPORT extern "C" __attribute__((visibility("default")))

namespace opforge::torch_native {

namespace {

// One op's direct entry: its declaration, the torch op to fall back on and its dispatcher handle.
struct Entry {
  const OpDef* op;
  PyObject* overload;  // strong reference
  std::optional<c10::OperatorHandle> handle;  // opforge::<name>, found at the first boxed call
};

// Whether a __torch_function__ must see a call with this tensor: a torch function mode is
// active, or its type (a subclass other than those that disable it, like nn.Parameter) has one.
// torch's own check (check_has_torch_function) is not exported from libtorch_python; this is
// its rule.
bool has_torch_function(PyObject* value) {
  if (at::impl::torch_function_mode_enabled()) return true;
  if (THPVariable_CheckExact(value) || at::impl::torch_function_all_disabled()) return false;
  static PyObject* const disabled = [] {
    PyObject* c = PyImport_ImportModule("torch._C");
    PyObject* impl = c ? PyObject_GetAttrString(c, "_disabled_torch_function_impl") : nullptr;
    Py_XDECREF(c);
    if (!impl) PyErr_Clear();
    return impl;  // kept for the process
  }();
  PyObject* attr = PyObject_GetAttrString(value, "__torch_function__");
  if (!attr) {
    PyErr_Clear();
    return false;
  }
  const bool has = attr != disabled;
  Py_DECREF(attr);
  return has;
}

PyObject* raise(const Error& error) {
  PyObject* type = PyExc_RuntimeError;
  switch (error.kind()) {
    case ErrorKind::type: type = PyExc_TypeError; break;
    case ErrorKind::value: type = PyExc_ValueError; break;
    case ErrorKind::not_implemented: type = PyExc_NotImplementedError; break;
    case ErrorKind::runtime: break;
  }
  PyErr_SetString(type, error.what());
  return nullptr;
}

// ValueError "<op>(): '<arg>' <what>" in place of the Python error a failed conversion left.
PyObject* bad_value(const OpDef& op, const ArgSpec& arg, const char* what) {
  PyErr_Clear();
  PyErr_Format(PyExc_ValueError, "%s(): '%s' %s", op.name().c_str(), arg.name.c_str(), what);
  return nullptr;
}

// The results as Python sees a torch op's: one tensor, or a tuple of them.
PyObject* wrap_results(std::vector<at::Tensor> results) {
  if (results.size() == 1) return THPVariable_Wrap(std::move(results[0]));
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(results.size()));
  if (!tuple) return nullptr;
  for (size_t i = 0; i < results.size(); ++i) {
    PyObject* item = THPVariable_Wrap(std::move(results[i]));
    if (!item) {
      Py_DECREF(tuple);
      return nullptr;
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), item);
  }
  return tuple;
}

// The op through torch's dispatcher, boxed, for plain CPU tensors that need a gradient: the
// arguments as the schema has them (tensors from args, attributes as converted), the results
// wrapped. Errors become Python exceptions as torch's own bindings make them.
PyObject* call_boxed(Entry& entry, PyObject* const* args, const OpInputs& inputs) {
  HANDLE_TH_ERRORS
  if (!entry.handle) entry.handle = c10::Dispatcher::singleton().findSchemaOrThrow(
                         ("opforge::" + entry.op->name()).c_str(), "");
  const auto& specs = entry.op->schema().args;
  torch::jit::Stack stack;
  stack.reserve(specs.size());
  size_t attr = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind == ArgKind::tensor || specs[i].kind == ArgKind::optional_tensor) {
      stack.emplace_back(args[i] == Py_None ? c10::IValue() : c10::IValue(THPVariable_Unpack(args[i])));
    } else {
      std::visit([&](const auto& v) { stack.emplace_back(v); }, inputs.attrs[attr++]);
    }
  }
  {
    pybind11::gil_scoped_release no_gil;  // as torch's own op bindings: kernels may run long
    entry.handle->callBoxed(stack);
  }
  std::vector<at::Tensor> results;
  results.reserve(stack.size());
  for (c10::IValue& value : stack) results.push_back(std::move(value).toTensor());
  return wrap_results(std::move(results));
  END_HANDLE_TH_ERRORS
}

// fn(*args): every schema argument, positional, in order (opforge.torch's generated wrapper
// binds names and defaults and checks argument kinds before calling this); fn(*args, *outs)
// writes the results into outs (below).
PyObject* direct_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  auto* entry = static_cast<Entry*>(PyCapsule_GetPointer(self, nullptr));
  if (!entry) return nullptr;
  const OpDef& op = *entry->op;
  const auto& specs = op.schema().args;
  // fn(*args, *outs): one out per result, the out variant's call (write_on_cpu) when it can be
  // direct; otherwise NotImplemented, and opforge.torch calls the out variant itself.
  const auto num_outs = static_cast<size_t>(op.schema().num_results);
  const bool writes_out = static_cast<size_t>(nargs) == specs.size() + num_outs;
  auto fall_back = [&] {
    return writes_out ? Py_NewRef(Py_NotImplemented)
                      : PyObject_Vectorcall(entry->overload, args, static_cast<size_t>(nargs), nullptr);
  };
  if (static_cast<size_t>(nargs) != specs.size() && !writes_out) return fall_back();
  // Whether this call may skip the dispatcher. The attributes are converted (and out-of-range
  // ones raise ValueError) either way, so a call that takes the torch op fails as this one would
  // rather than in torch's argument parser.
  bool direct = thread_allows_direct(op);
  bool boxed = direct;  // every tensor plain CPU, some needing a gradient: call_boxed
  try {
    const bool grad_mode = at::GradMode::is_enabled();
    OpInputs inputs = OpInputs::reserved_for(op.schema());
    for (size_t i = 0; i < specs.size(); ++i) {
      PyObject* value = args[i];
      switch (specs[i].kind) {
        case ArgKind::optional_tensor:
          if (value == Py_None) {
            inputs.tensors.emplace_back(std::nullopt);
            break;
          }
          [[fallthrough]];
        case ArgKind::tensor: {
          // direct: plain and needing no gradient; boxed: plain (some may need a gradient). A
          // __torch_function__ (a subclass's, or an active TorchFunctionMode) must see the call:
          // the torch op's Python entry gives it that.
          const at::Tensor* t = boxed && THPVariable_Check(value) && !has_torch_function(value)
                                    ? &THPVariable_Unpack(value)
                                    : nullptr;
          boxed = t && plain_cpu(*t);
          direct = direct && boxed && !(grad_mode && t->requires_grad());
          if (direct) inputs.tensors.emplace_back(view_of(*t));
          break;
        }
        // The generated wrapper has checked the kinds: a failed conversion is a value out of range.
        case ArgKind::float_: {
          const double v = PyFloat_AsDouble(value);
          if (v == -1.0 && PyErr_Occurred()) return bad_value(op, specs[i], "is out of the float range");
          inputs.attrs.emplace_back(v);
          break;
        }
        case ArgKind::int_: {
          const long long v = PyLong_AsLongLong(value);
          if (v == -1 && PyErr_Occurred()) return bad_value(op, specs[i], "must fit in 64 bits");
          inputs.attrs.emplace_back(static_cast<int64_t>(v));
          break;
        }
        case ArgKind::bool_: {  // True, False or numpy.bool_
          const int truth = PyObject_IsTrue(value);
          if (truth < 0) return nullptr;
          inputs.attrs.emplace_back(truth == 1);
          break;
        }
        case ArgKind::str: {
          Py_ssize_t length = 0;
          const char* text = PyUnicode_AsUTF8AndSize(value, &length);
          if (!text) return bad_value(op, specs[i], "is not valid Unicode text (it has a lone surrogate)");
          inputs.attrs.emplace_back(std::string(text, static_cast<size_t>(length)));
          break;
        }
      }
    }
    if (writes_out) {
      std::vector<at::Tensor> outs;
      for (size_t i = specs.size(); direct && i < specs.size() + num_outs; ++i) {
        PyObject* value = args[i];
        direct = THPVariable_Check(value) && !has_torch_function(value) && plain_cpu(THPVariable_Unpack(value)) &&
                 !(grad_mode && THPVariable_Unpack(value).requires_grad());
        if (direct) outs.push_back(THPVariable_Unpack(value));
      }
      if (!direct) return fall_back();
      write_on_cpu(op, inputs, outs, /*holds_gil=*/true);
      Py_RETURN_NONE;
    }
    if (!direct) return boxed ? call_boxed(*entry, args, inputs) : fall_back();
    return wrap_results(run_on_cpu(op, inputs, /*holds_gil=*/true));
  } catch (const Error& error) {
    return raise(error);
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
}

PyMethodDef kDirectCall{"direct_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&direct_call)),
                        METH_FASTCALL, "opforge.torch's direct call of one op (internal)"};

void free_entry(PyObject* capsule) {
  auto* entry = static_cast<Entry*>(PyCapsule_GetPointer(capsule, nullptr));
  Py_XDECREF(entry->overload);
  delete entry;
}

}  // namespace

}  // namespace opforge::torch_native

// The direct call of op `name`, falling back on `overload` (torch.ops.opforge.<name>.default),
// or nullptr with a Python error set. Called through ctypes.PyDLL, which holds the GIL.
OPFORGE_TORCH_EXPORT PyObject* opforge_torch_native_direct_call(const char* name, PyObject* overload) {
  using namespace opforge::torch_native;
  const opforge::OpDef* op = opforge::lookup_op(name);
  if (!op) {
    PyErr_Format(PyExc_KeyError, "no opforge op named '%s'", name);
    return nullptr;
  }
  auto* entry = new Entry{op, overload};
  Py_INCREF(overload);
  PyObject* capsule = PyCapsule_New(entry, nullptr, free_entry);
  if (!capsule) {
    Py_DECREF(overload);
    delete entry;
    return nullptr;
  }
  PyObject* fn = PyCFunction_New(&kDirectCall, capsule);
  Py_DECREF(capsule);
  return fn;
}
