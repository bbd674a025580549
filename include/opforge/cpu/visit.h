// From a runtime dtype to a C++ element type. Half types are Highway's storage types so
// SIMD code can load them directly.
#pragma once

#include <hwy/base.h>

#include "opforge/error.h"
#include "opforge/tensor.h"

namespace opforge::cpu {

// Calls f(T{}) for the float dtypes; Error(not_implemented) for others.
template <typename F>
decltype(auto) visit_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::float32: return f(float{});
    case DType::float64: return f(double{});
    case DType::float16: return f(hwy::float16_t{});
    case DType::bfloat16: return f(hwy::bfloat16_t{});
    default: fail(ErrorKind::not_implemented, op, "(): cpu kernel has no ", dtype_name(dtype), " variant");
  }
}

// As visit_float, plus int32 and int64.
template <typename F>
decltype(auto) visit_numeric(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::int32: return f(int32_t{});
    case DType::int64: return f(int64_t{});
    default: return visit_float(dtype, op, f);
  }
}

}  // namespace opforge::cpu
