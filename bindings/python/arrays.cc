#include "arrays.h"

#include <dlpack/dlpack.h>

#include <string>
#include <unordered_map>

#include "numpy_arrays.h"
#include "opforge/error.h"

namespace opforge::python {

Framework framework_of(nb::handle obj) {
  static std::unordered_map<PyTypeObject*, Framework> cache;
  PyTypeObject* type = Py_TYPE(obj.ptr());
  auto it = cache.find(type);
  if (it != cache.end()) return it->second;
  Framework f = Framework::other;
  nb::object module = nb::getattr(nb::handle(reinterpret_cast<PyObject*>(type)), "__module__", nb::none());
  if (nb::isinstance<nb::str>(module)) {
    std::string m = nb::cast<std::string>(module);
    std::string root = m.substr(0, m.find('.'));
    if (root == "numpy") f = Framework::numpy;
    else if (root == "torch") f = Framework::torch;
    else if (root == "jax" || root == "jaxlib") f = Framework::jax;
    else if (root == "cupy") f = Framework::cupy;
  }
  cache.emplace(type, f);
  return f;
}

std::string python_type_name(nb::handle obj) {
  return nb::cast<std::string>(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()))).attr("__name__"));
}

std::string python_str(nb::handle obj) { return nb::cast<std::string>(nb::str(obj)); }

std::string framework_dtype_name(nb::handle array, std::string fallback) {
  if (!nb::hasattr(array, "dtype")) return fallback;
  std::string name = python_str(array.attr("dtype"));
  return name.starts_with("torch.") ? name.substr(6) : name;
}

bool import_array(nb::handle obj, nb::ndarray<nb::ro>& out) {
  // convert=false: never copy, never cast a Python list into an array behind the user's back.
  return nb::try_cast(obj, out, false);
}

PyObject* module_function(PyObject*& cache, const char* module, const char* name) {
  if (!cache) cache = nb::object(nb::module_::import_(module).attr(name)).release().ptr();
  return cache;
}

nb::object torch_cpu_capsule(nb::handle tensor) {
  if (!nb::cast<bool>(tensor.attr("is_cpu"))) return nb::object();
  static PyObject* to_dlpack = nullptr;
  PyObject* capsule = PyObject_CallOneArg(module_function(to_dlpack, "torch.utils.dlpack", "to_dlpack"), tensor.ptr());
  if (!capsule) PyErr_Clear();  // e.g. a sparse tensor: the generic import says what it is
  return nb::steal(capsule);
}

namespace {
template <typename Array>
TensorView view_of_any(const Array& a) {
  DLTensor t{};
  t.data = const_cast<void*>(a.data());
  t.device.device_type = static_cast<DLDeviceType>(a.device_type());
  t.device.device_id = a.device_id();
  t.ndim = static_cast<int32_t>(a.ndim());
  t.dtype = {a.dtype().code, a.dtype().bits, a.dtype().lanes};
  t.shape = const_cast<int64_t*>(a.shape_ptr());
  t.strides = const_cast<int64_t*>(a.stride_ptr());
  return from_dlpack(t);
}
}  // namespace

TensorView view_of(const nb::ndarray<nb::ro>& a) { return view_of_any(a); }
TensorView view_of(const nb::ndarray<>& a) { return view_of_any(a); }

namespace {
struct Owner {
  Backend* backend;
  void* ptr;
  Device device;
  void* fence = nullptr;  // Backend::fence after the writing kernel; nullptr: free at once
};
}  // namespace

void Allocation::fence(void* stream) const {
  auto* o = static_cast<Owner*>(owner.data());
  o->fence = o->backend->fence(o->device, stream);
}

Allocation allocate(Backend& backend, DType dtype, const Dims& shape,
                    const Dims& strides, Device device, void* stream) {
  TensorView view;
  view.dtype = dtype;
  view.device = device;
  view.shape = shape;
  view.strides = strides;
  view.data = backend.allocate(view.nbytes(), device, stream);
  auto* owner = new Owner{&backend, view.data, device};
  nb::capsule capsule(owner, [](void* p) noexcept {
    auto* o = static_cast<Owner*>(p);
    o->backend->release(o->ptr, o->device, o->fence);
    delete o;
  });
  return {std::move(view), std::move(capsule)};
}

namespace {
template <typename F>
nb::ndarray<F> ndarray_of(const Allocation& r) {
  const TensorView& v = r.view;
  std::vector<size_t> shape(v.shape.begin(), v.shape.end());
  const nb::dlpack::dtype dt{dlpack_type_code(v.dtype), static_cast<uint8_t>(dtype_size(v.dtype) * 8), 1};
  const int device_type = v.device.type == DeviceType::cpu ? 1 : 2;  // kDLCPU, kDLCUDA
  return nb::ndarray<F>(v.data, shape.size(), shape.data(), r.owner, v.strides.data(), dt, device_type,
                        v.device.index);
}

template <typename F>
nb::object wrap_as(const Allocation& r) {
  return ndarray_of<F>(r).cast(nb::rv_policy::reference);
}

// A torch tensor from a bare DLPack capsule: torch.utils.dlpack.from_dlpack goes straight to
// torch's C++ importer with one, where an array object costs it a round of Python checks.
nb::object torch_tensor_of(const Allocation& r) {
  static PyObject* from_dlpack = nullptr;
  nb::object capsule = ndarray_of<nb::no_framework>(r).cast(nb::rv_policy::reference);
  PyObject* tensor =
      PyObject_CallOneArg(module_function(from_dlpack, "torch.utils.dlpack", "from_dlpack"), capsule.ptr());
  if (!tensor) throw nb::python_error();
  return nb::steal(tensor);
}

// A NumPy array: through NumPy's C API, else (bfloat16) through nanobind's DLPack export.
nb::object numpy_array(const Allocation& r) {
  if (nb::object array = numpy_wrap(r); array.is_valid()) return array;
  return wrap_as<nb::numpy>(r);
}
}  // namespace

nb::object wrap(const Allocation& r, Framework framework) {
  switch (framework) {
    case Framework::numpy: return numpy_array(r);
    case Framework::torch:
      // CUDA results keep nanobind's route, whose __dlpack__ exchange is the one to trust there.
      if (r.view.device.type == DeviceType::cpu) return torch_tensor_of(r);
      return wrap_as<nb::pytorch>(r);
    case Framework::jax: return wrap_as<nb::jax>(r);
    case Framework::cupy: return wrap_as<nb::cupy>(r);
    case Framework::other: break;
  }
  // Unknown array kinds get NumPy on the CPU and elsewhere nanobind's array-API object, which
  // any DLPack consumer takes (__dlpack__, __dlpack_device__); no_framework would be a bare capsule.
  if (r.view.device.type == DeviceType::cpu) return numpy_array(r);
  return wrap_as<nb::array_api>(r);
}

void* current_stream(Framework framework, Device device) {
  if (device.type != DeviceType::cuda) return nullptr;
  if (framework == Framework::torch) {
    nb::object stream = nb::module_::import_("torch").attr("cuda").attr("current_stream")(device.index);
    return reinterpret_cast<void*>(nb::cast<uintptr_t>(stream.attr("cuda_stream")));
  }
  if (framework == Framework::cupy) {
    nb::object stream = nb::module_::import_("cupy").attr("cuda").attr("get_current_stream")();
    return reinterpret_cast<void*>(nb::cast<uintptr_t>(stream.attr("ptr")));
  }
  // JAX and unknown producers: their stream is not ours to know. Never the legacy default
  // stream (it serializes against every blocking stream in the process): CUDA's per-thread
  // default stream (cudaStreamPerThread, DLPack's stream code 2); call_op waits for it before
  // handing results back, and JAX inputs are made ready first (prepare_call).
  return reinterpret_cast<void*>(uintptr_t{2});
}

bool synchronizes_on_return(Framework framework) {
  return framework != Framework::torch && framework != Framework::cupy;
}

}  // namespace opforge::python
