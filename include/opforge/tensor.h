// The one tensor type kernels see: a non-owning view of someone else's memory.
// Shapes and strides are int64 and counted in elements (not bytes), as in torch and DLPack.
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <optional>

#include "opforge/device.h"
#include "opforge/dims.h"
#include "opforge/dtype.h"

namespace opforge {

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::float32;
  Device device;
  Dims shape;
  Dims strides;  // elements; same length as shape

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const;
  // Size of dimension `dim`; negative counts from the end.
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  bool is_contiguous() const;
  int64_t nbytes() const { return numel() * dtype_size(dtype); }

  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data);
  }
};

// Row-major strides for `shape`.
Dims contiguous_strides(const Dims& shape);

// Strides of `t` broadcast against `shape` (aligned right, NumPy rules): 0 where t has size 1
// or lacks the dimension. Kernels of broadcasting ops walk their inputs with these.
Dims broadcast_strides(const TensorView& t, const Dims& shape);

// A view of a DLPack tensor (no copy). Throws Error(type) for dtypes or devices opforge
// does not know; the byte offset is folded into the data pointer.
TensorView from_dlpack(const DLTensor& tensor);
// The opforge dtype of a DLPack dtype; nullopt where opforge has none (complex, uint16, ...).
std::optional<DType> dtype_from_dlpack(DLDataType dtype);

// DLPack's type code for `dtype` (kDLFloat, kDLBfloat, ...); bits are dtype_size() * 8.
uint8_t dlpack_type_code(DType dtype);

// A DLPack tensor describing `view`. The returned object owns copies of shape and
// strides; its deleter calls `release(owner)` (if given) so the memory's owner can be freed.
DLManagedTensor* to_dlpack(const TensorView& view, void* owner, void (*release)(void*));

}  // namespace opforge
