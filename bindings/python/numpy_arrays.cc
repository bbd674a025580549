#include "numpy_arrays.h"

#include <optional>

// The only file that uses NumPy's C API, so its function table stays private to it.
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

namespace opforge::python {

namespace {

// Loads NumPy's C API on first use (NumPy is imported by then: the caller holds an array).
// A NumPy older than the headers' target refuses; then every call takes the generic path.
bool numpy_api_ready() {
  static int state = 0;  // 0: not tried; 1: loaded; -1: unavailable. Guarded by the GIL.
  if (state == 0) {
    state = _import_array() < 0 ? -1 : 1;
    if (state < 0) PyErr_Clear();
  }
  return state > 0;
}

std::optional<DType> dtype_of(PyArrayObject* array) {
  switch (PyArray_TYPE(array)) {
    case NPY_BOOL: return DType::boolean;
    case NPY_BYTE: return DType::int8;
    case NPY_UBYTE: return DType::uint8;
    case NPY_HALF: return DType::float16;
    case NPY_FLOAT: return DType::float32;
    case NPY_DOUBLE: return DType::float64;
    case NPY_INT:
    case NPY_LONG:
    case NPY_LONGLONG:  // C's int types: which is 32 and which 64 bits depends on the platform
      switch (PyArray_ITEMSIZE(array)) {
        case 4: return DType::int32;
        case 8: return DType::int64;
        default: return std::nullopt;
      }
    default: return std::nullopt;
  }
}

int numpy_type_of(DType dtype) {
  switch (dtype) {
    case DType::boolean: return NPY_BOOL;
    case DType::int8: return NPY_INT8;
    case DType::uint8: return NPY_UINT8;
    case DType::int32: return NPY_INT32;
    case DType::int64: return NPY_INT64;
    case DType::float16: return NPY_FLOAT16;
    case DType::float32: return NPY_FLOAT32;
    case DType::float64: return NPY_FLOAT64;
    default: return -1;  // bfloat16: not a NumPy type
  }
}

}  // namespace

bool numpy_view(nb::handle obj, TensorView& out) {
  if (!numpy_api_ready() || !PyArray_Check(obj.ptr())) return false;
  auto* array = reinterpret_cast<PyArrayObject*>(obj.ptr());
  const std::optional<DType> dtype = dtype_of(array);
  if (!dtype || PyArray_ISBYTESWAPPED(array)) return false;
  const int rank = PyArray_NDIM(array);
  const npy_intp* sizes = PyArray_DIMS(array);
  const npy_intp* byte_strides = PyArray_STRIDES(array);
  const npy_intp item = PyArray_ITEMSIZE(array);
  for (int d = 0; d < rank; ++d)
    if (byte_strides[d] % item != 0) return false;  // opforge's strides count whole elements
  out.data = PyArray_DATA(array);
  out.dtype = *dtype;
  out.device = Device{DeviceType::cpu, 0};
  out.shape.assign(sizes, sizes + rank);
  out.strides.resize(rank);
  for (int d = 0; d < rank; ++d) out.strides[d] = byte_strides[d] / item;
  return true;
}

bool numpy_writeable(nb::handle obj) { return PyArray_ISWRITEABLE(reinterpret_cast<PyArrayObject*>(obj.ptr())); }

nb::object numpy_wrap(const Allocation& result) {
  const TensorView& view = result.view;
  const int type = numpy_type_of(view.dtype);
  if (type < 0 || !numpy_api_ready() || view.rank() > NPY_MAXDIMS) return nb::object();
  npy_intp sizes[NPY_MAXDIMS], byte_strides[NPY_MAXDIMS];
  const int64_t item = dtype_size(view.dtype);
  for (int64_t d = 0; d < view.rank(); ++d) {
    sizes[d] = view.shape[d];
    byte_strides[d] = view.strides[d] * item;
  }
  PyObject* array = PyArray_NewFromDescr(&PyArray_Type, PyArray_DescrFromType(type), static_cast<int>(view.rank()),
                                         sizes, byte_strides, view.data, NPY_ARRAY_WRITEABLE, nullptr);
  if (!array) throw nb::python_error();
  nb::object owned = nb::steal(array);
  // The array's base owns the memory: freed when the last view of it goes.
  if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(array), result.owner.inc_ref().ptr()) < 0)
    throw nb::python_error();
  return owned;
}

nb::object numpy_small_result(DType dtype, const Dims& shape, const Dims& strides, TensorView& view) {
  const int type = numpy_type_of(dtype);
  const int64_t item = dtype_size(dtype);
  if (type < 0 || shape.size() > NPY_MAXDIMS || !numpy_api_ready()) return nb::object();
  int64_t elements = 1;
  for (int64_t size : shape) elements *= size;
  if (elements * item > kNumpySmallResultBytes) return nb::object();
  npy_intp sizes[NPY_MAXDIMS], byte_strides[NPY_MAXDIMS];
  for (size_t d = 0; d < shape.size(); ++d) {
    sizes[d] = shape[d];
    byte_strides[d] = strides[d] * item;
  }
  // Null data: NumPy allocates the elements (the strides are a dense layout's: they fit them).
  PyObject* array = PyArray_NewFromDescr(&PyArray_Type, PyArray_DescrFromType(type), static_cast<int>(shape.size()),
                                         sizes, byte_strides, nullptr, NPY_ARRAY_WRITEABLE, nullptr);
  if (!array) throw nb::python_error();
  view.data = PyArray_DATA(reinterpret_cast<PyArrayObject*>(array));
  view.dtype = dtype;
  view.device = Device{DeviceType::cpu, 0};
  view.shape = shape;
  view.strides = strides;
  return nb::steal(array);
}

}  // namespace opforge::python
