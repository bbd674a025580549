// opforge's dtypes <-> ATen's scalar types, for the libraries built against torch's full C++
// API (bindings/torch_native, bindings/forge). The stable-ABI adapter (bindings/torch) has its
// own mapping on the stable types.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

#include "opforge/dtype.h"

namespace opforge::aten {

// nullopt for scalar types opforge lacks.
inline std::optional<DType> dtype_of(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DType::float32;
    case at::kDouble: return DType::float64;
    case at::kHalf: return DType::float16;
    case at::kBFloat16: return DType::bfloat16;
    case at::kChar: return DType::int8;
    case at::kByte: return DType::uint8;
    case at::kInt: return DType::int32;
    case at::kLong: return DType::int64;
    case at::kBool: return DType::boolean;
    default: return std::nullopt;
  }
}

// A scalar type's name as torch's Python spells it (complex64, not ComplexFloat), for the error
// about one opforge lacks; ATen's own name for those not listed.
inline std::string python_name_of(at::ScalarType type) {
  switch (type) {
    case at::kShort: return "int16";
    case at::kUInt16: return "uint16";
    case at::kUInt32: return "uint32";
    case at::kUInt64: return "uint64";
    case at::kComplexHalf: return "complex32";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    case at::kFloat8_e4m3fn: return "float8_e4m3fn";
    case at::kFloat8_e5m2: return "float8_e5m2";
    default: return c10::toString(type);
  }
}

inline at::ScalarType scalar_type_of(DType dtype) {
  switch (dtype) {
    case DType::float32: return at::kFloat;
    case DType::float64: return at::kDouble;
    case DType::float16: return at::kHalf;
    case DType::bfloat16: return at::kBFloat16;
    case DType::int8: return at::kChar;
    case DType::uint8: return at::kByte;
    case DType::int32: return at::kInt;
    case DType::int64: return at::kLong;
    case DType::boolean: return at::kBool;
  }
  return at::kFloat;  // unreachable: every DType is listed
}

}  // namespace opforge::aten
