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
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings/common/aten_dtype.h"
#include "opforge/backend.h"
#include "opforge/dispatch.h"
#include "opforge/registry.h"

#define OPFORGE_TORCH_EXPORT extern "C" __attribute__((visibility("default")))

namespace opforge::torch_native {

namespace {

using aten::dtype_of;
using aten::scalar_type_of;

// One op's direct entry: its declaration, the torch op to fall back on and its dispatcher handle.
struct Entry {
  const OpDef* op;
  PyObject* overload;  // strong reference
  std::optional<c10::OperatorHandle> handle;  // opforge::<name>, found at the first boxed call
};

// Keys that mean "someone else must see this call": on a tensor, subclasses and FakeTensors
// (Python), functionalization, functorch's vmap/grad wrappers; in the thread's included set,
// an active dispatch mode or functorch transform.
const c10::DispatchKeySet kNeedsDispatcher{
    c10::DispatchKey::Python,         c10::DispatchKey::PythonTLSSnapshot,
    c10::DispatchKey::PythonDispatcher, c10::DispatchKey::PreDispatch,
    c10::DispatchKey::Functionalize,  c10::DispatchKey::FuncTorchDynamicLayerFrontMode,
    c10::DispatchKey::FuncTorchDynamicLayerBackMode, c10::DispatchKey::FuncTorchBatched,
    c10::DispatchKey::FuncTorchGradWrapper, c10::DispatchKey::FuncTorchVmapMode,
    c10::DispatchKey::BatchedNestedTensor};

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

// A dense CPU tensor of an opforge dtype that nothing else must see: no subclass, functorch
// wrapper, conjugate or negative view, forward-AD tangent (the op refuses forward AD).
bool plain_cpu(const at::Tensor& t) {
  return t.device().type() == c10::DeviceType::CPU && t.layout() == c10::kStrided &&
         !t.key_set().has_any(kNeedsDispatcher) && !t.is_conj() && !t.is_neg() &&
         !t._fw_grad(/*level=*/0).defined() && dtype_of(t.scalar_type()).has_value();
}

// A plain CPU tensor's view for the fast path.
TensorView view_of(const at::Tensor& t) {
  TensorView view;
  view.data = t.data_ptr();  // includes the storage offset
  view.dtype = *dtype_of(t.scalar_type());
  view.device = Device{DeviceType::cpu, 0};
  view.shape.assign(t.sizes().begin(), t.sizes().end());
  view.strides.assign(t.strides().begin(), t.strides().end());
  return view;
}

// Large results come from the CPU backend's memory, which keeps freed blocks mapped (torch's
// allocator returns them, so each large result would pay its page faults again); as in
// bindings/torch/call.cc.
constexpr int64_t kBackendAllocationBytes = int64_t{1} << 20;

// Below this many result elements a kernel takes about as long as handing the GIL over twice.
constexpr int64_t kReleaseGilElements = 16384;

at::Tensor allocate(Backend& backend, const TensorView& view) {
  const auto options = at::TensorOptions().dtype(scalar_type_of(view.dtype)).device(at::kCPU);
  if (view.nbytes() < kBackendAllocationBytes) return at::empty(view.shape, options);
  void* data = backend.allocate(view.nbytes(), view.device, nullptr);
  Backend* owner = &backend;
  auto release = [owner](void* p) { owner->release(p, Device{DeviceType::cpu, 0}, nullptr); };
  return at::from_blob(data, view.shape, view.strides, release, options);
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
// binds names and defaults and checks argument kinds before calling this).
PyObject* direct_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  auto* entry = static_cast<Entry*>(PyCapsule_GetPointer(self, nullptr));
  if (!entry) return nullptr;
  const OpDef& op = *entry->op;
  const auto& specs = op.schema().args;
  auto fall_back = [&] { return PyObject_Vectorcall(entry->overload, args, static_cast<size_t>(nargs), nullptr); };
  if (static_cast<size_t>(nargs) != specs.size()) return fall_back();
  // Whether this call may skip the dispatcher. The attributes are converted (and out-of-range
  // ones raise ValueError) either way, so a call that takes the torch op fails as this one would
  // rather than in torch's argument parser.
  bool direct = !c10::impl::tls_local_dispatch_key_set().included_.has_any(kNeedsDispatcher);
  // Under torch.autocast("cpu") an op with a cast policy casts in its autocast kernel (autocast.cc).
  direct = direct && !(op.autocast_policy() != AutocastPolicy::none && at::autocast::is_autocast_enabled(at::kCPU));
  bool boxed = direct;  // every tensor plain CPU, some needing a gradient: call_boxed
  try {
    const bool grad_mode = at::GradMode::is_enabled();
    OpInputs inputs;
    const auto tensor_args = static_cast<size_t>(op.schema().num_tensor_args());
    inputs.tensors.reserve(tensor_args);
    if (tensor_args < specs.size()) inputs.attrs.reserve(specs.size() - tensor_args);
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
    if (!direct) return boxed ? call_boxed(*entry, args, inputs) : fall_back();
    const Outputs results = infer_outputs(op, inputs);
    const Selection selection = select_kernel(op, inputs);
    std::vector<at::Tensor> outputs;
    std::vector<TensorView> views;
    outputs.reserve(results.size());
    views.reserve(results.size());
    for (const OutputSpec& spec : results) {
      TensorView view{nullptr, spec.dtype, Device{DeviceType::cpu, 0}, spec.shape, contiguous_strides(spec.shape)};
      try {
        outputs.push_back(allocate(*selection.backend, view));
      } catch (const std::exception& error) {  // opforge's Error or torch's c10::Error
        fail_result_allocation(op, error);
      }
      view.data = outputs.back().data_ptr();
      views.push_back(std::move(view));
    }
    int64_t work = 0;
    for (const TensorView& v : views) work += v.numel();
    if (work < kReleaseGilElements) {
      run_kernel(op, selection, inputs, views, nullptr);
    } else {
      // Kernels may run long and use the thread pool; other Python threads go on meanwhile.
      PyThreadState* state = PyEval_SaveThread();
      try {
        run_kernel(op, selection, inputs, views, nullptr);
      } catch (...) {
        PyEval_RestoreThread(state);
        throw;
      }
      PyEval_RestoreThread(state);
    }
    return wrap_results(std::move(outputs));
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
