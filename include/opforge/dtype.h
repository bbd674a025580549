// Element types and their names. The set follows DLPack's type codes so that a tensor view
// converts to and from DLPack without a table of special cases.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace opforge {

enum class DType : uint8_t {
  float32,
  float64,
  float16,
  bfloat16,
  int8,
  uint8,
  int32,
  int64,
  boolean,
};

inline constexpr DType kAllDTypes[] = {DType::float32, DType::float64, DType::float16,
                                       DType::bfloat16, DType::int8,    DType::uint8,
                                       DType::int32,   DType::int64,   DType::boolean};

// Bytes per element.
int64_t dtype_size(DType dtype);
// "float32", "bfloat16", "bool", ... (the names NumPy, torch and JAX share).
std::string_view dtype_name(DType dtype);
// Inverse of dtype_name; throws opforge::Error(type) for an unknown name.
DType dtype_from_name(std::string_view name);
bool is_floating(DType dtype);
// "[float32, float64]" for error messages and listings.
std::string dtype_list(const std::vector<DType>& dtypes);

}  // namespace opforge
