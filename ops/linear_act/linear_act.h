// Shared by linear_act's and linear_act_backward's kernels: a tensor [..., k] as a matrix of rows.
#pragma once

#include <cstdint>
#include <vector>

#include "opforge/cpu/strided.h"
#include "opforge/tensor.h"

namespace opforge::linear_act {

// The stride between consecutive rows when t's leading dimensions step evenly (always true for a
// contiguous t, a slice of one, or a transposed matrix); false otherwise.
inline bool row_stride(const TensorView& t, int64_t* stride) {
  *stride = 0;
  int64_t span = 0;  // the distance the dims inside the current one cover; 0 before the first
  for (int64_t dim = t.rank() - 2; dim >= 0; --dim) {
    if (t.shape[dim] == 1) continue;
    if (span == 0) *stride = t.strides[dim];
    else if (t.strides[dim] != span) return false;
    span = t.strides[dim] * t.shape[dim];
    if (span == 0) return false;  // a broadcast leading dim followed by more: rare, gathered
  }
  return true;
}

// t's rows gathered into a contiguous [rows, t.size(-1)] copy, for layouts row_stride rejects.
template <typename T>
std::vector<T> gather_rows(const TensorView& t) {
  const int64_t k = t.size(-1), rows = k ? t.numel() / k : 0;
  std::vector<T> out(rows * k);
  const T* src = t.data_as<const T>();
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = src + cpu::offset_of(r, t.shape.data(), t.strides.data(), t.rank() - 1);
    for (int64_t i = 0; i < k; ++i) out[r * k + i] = row[i * t.stride(-1)];
  }
  return out;
}

}  // namespace opforge::linear_act
