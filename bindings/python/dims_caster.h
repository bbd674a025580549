// nanobind's conversion of opforge::Dims (a shape or strides): from any sequence of Python
// integers (a tuple, a list, a torch.Size; NumPy integers too), to a tuple, as shapes are in Python.
#pragma once

#include <nanobind/nanobind.h>

#include "opforge/dims.h"

NAMESPACE_BEGIN(NB_NAMESPACE)
NAMESPACE_BEGIN(detail)

template <>
struct type_caster<opforge::Dims> {
  NB_TYPE_CASTER(opforge::Dims, const_name("tuple[int, ...]"))

  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    PyObject* items = PySequence_Fast(src.ptr(), "");
    if (!items) {
      PyErr_Clear();
      return false;
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    value.clear();
    bool ok = true;
    for (Py_ssize_t i = 0; i < n && ok; ++i) {
      PyObject* index = PyNumber_Index(PySequence_Fast_GET_ITEM(items, i));  // an int, a NumPy integer
      const long long v = index ? PyLong_AsLongLong(index) : -1;
      Py_XDECREF(index);
      ok = !(v == -1 && PyErr_Occurred());
      if (ok) value.push_back(static_cast<int64_t>(v));
    }
    Py_DECREF(items);
    if (!ok) PyErr_Clear();
    return ok;
  }

  static handle from_cpp(const opforge::Dims& dims, rv_policy, cleanup_list*) noexcept {
    PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(dims.size()));
    if (!tuple) return handle();
    for (size_t i = 0; i < dims.size(); ++i) {
      PyObject* item = PyLong_FromLongLong(dims[i]);
      if (!item) {
        Py_DECREF(tuple);
        return handle();
      }
      PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), item);
    }
    return tuple;
  }
};

NAMESPACE_END(detail)
NAMESPACE_END(NB_NAMESPACE)
