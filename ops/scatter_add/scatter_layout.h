// Shared by scatter_add and scatter_add_backward (declarations and CPU kernels): the 'dim'
// check, a tensor seen as slices along dim, and the bounds-checked index.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>
#include <vector>

#include "opforge/cpu/strided.h"
#include "opforge/op.h"

namespace opforge::scatter {

// 'dim' in [-rank, rank) of tensor argument `tensor`, made non-negative.
inline int64_t checked_dim(const ArgAccess& c, std::string_view tensor) {
  const int64_t rank = c.tensor(tensor).rank();
  const int64_t dim = c.attr_int("dim");
  if (dim < -rank || dim >= rank)
    c.fail(ErrorKind::value, "'dim' must be in [", -rank, ", ", rank, ") for '", tensor, "' of rank ", rank,
           ", got ", dim);
  return dim < 0 ? dim + rank : dim;
}

// A tensor as [outer, n, inner] around dim: slice (o, i) starts at base(o) + i * step and
// holds `inner` elements, adjacent when inner_contiguous.
struct Slices {
  int64_t outer = 1, n = 0, inner = 1, step = 0;
  Dims outer_shape, outer_strides;
  bool inner_contiguous = true;

  int64_t base(int64_t o) const {
    return cpu::offset_of(o, outer_shape.data(), outer_strides.data(), static_cast<int64_t>(outer_shape.size()));
  }
};

inline Slices slices_of(const TensorView& t, int64_t dim) {
  Slices s;
  s.n = t.shape[dim];
  s.step = t.strides[dim];
  s.outer_shape.assign(t.shape.begin(), t.shape.begin() + dim);
  s.outer_strides.assign(t.strides.begin(), t.strides.begin() + dim);
  for (int64_t extent : s.outer_shape) s.outer *= extent;
  for (int64_t d = t.rank() - 1; d > dim; --d) {
    if (t.shape[d] != 1 && t.strides[d] != s.inner) s.inner_contiguous = false;
    s.inner *= t.shape[d];
  }
  return s;
}

// The one message for a bad index value, on every backend. `bound` names the limit ("dim_size").
[[noreturn]] inline void fail_index(const ArgAccess& c, std::string_view bound, int64_t limit, int64_t value,
                                    int64_t position) {
  c.fail(ErrorKind::value, "'index' must hold values in [0, ", bound, ") = [0, ", limit, "), got ", value,
         " at position ", position);
}

// The index (1-D int32/int64, any stride), read in place: a copy would cost a page fault per
// 4 KiB on every call.
struct IndexView {
  const void* data;
  int64_t stride;
  bool wide;  // int64

  int64_t operator[](int64_t i) const {
    return wide ? static_cast<const int64_t*>(data)[i * stride] : static_cast<const int32_t*>(data)[i * stride];
  }
};

// The index, every value checked against [0, limit) before the caller writes anything. The
// scan runs in parallel chunks; the error names the first bad position whatever the schedule.
inline IndexView checked_index(const ArgAccess& c, int64_t limit, std::string_view bound) {
  const TensorView& t = c.tensor("index");
  const IndexView index{t.data, t.strides[0], t.dtype == DType::int64};
  const int64_t n = t.shape[0];
  std::atomic<int64_t> first_bad{n};
  parallel_for(n, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t v = index[i];
      if (v < 0 || v >= limit) {
        int64_t seen = first_bad.load();
        while (i < seen && !first_bad.compare_exchange_weak(seen, i)) {
        }
        return;
      }
    }
  });
  if (first_bad < n) fail_index(c, bound, limit, index[first_bad], first_bad);
  return index;
}

// t's elements in a contiguous buffer, for the rare layouts whose slices are not contiguous.
template <typename T>
std::vector<T> contiguous_copy(const TensorView& t) {
  std::vector<T> copy(t.numel());
  const T* src = t.data_as<const T>();
  cpu::for_each_row<2>(t.shape, {contiguous_strides(t.shape), t.strides}, 1 << 15, [&](const cpu::Row<2>& r) {
    for (int64_t k = 0; k < r.len; ++k) copy[r.offsets[0] + k] = src[r.offsets[1] + k * r.inner[1]];
  });
  return copy;
}

}  // namespace opforge::scatter
