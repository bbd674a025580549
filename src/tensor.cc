// dtype and device names, tensor view geometry, and the DLPack bridge.
#include "opforge/tensor.h"

#include <dlpack/dlpack.h>

#include <memory>

#include "opforge/error.h"

namespace opforge {

namespace {
struct DTypeInfo {
  DType dtype;
  const char* name;
  int64_t size;
  uint8_t dl_code;
};
// DLPack's code for bool (6) postdates the dlpack 0.6 header Debian ships.
constexpr uint8_t kDLBoolCode = 6;
constexpr DTypeInfo kDTypes[] = {
    {DType::float32, "float32", 4, kDLFloat},  {DType::float64, "float64", 8, kDLFloat},
    {DType::float16, "float16", 2, kDLFloat},  {DType::bfloat16, "bfloat16", 2, kDLBfloat},
    {DType::int8, "int8", 1, kDLInt},          {DType::uint8, "uint8", 1, kDLUInt},
    {DType::int32, "int32", 4, kDLInt},        {DType::int64, "int64", 8, kDLInt},
    {DType::boolean, "bool", 1, kDLBoolCode},
};
const DTypeInfo& info(DType dtype) { return kDTypes[static_cast<int>(dtype)]; }
}  // namespace

int64_t dtype_size(DType dtype) { return info(dtype).size; }
uint8_t dlpack_type_code(DType dtype) { return info(dtype).dl_code; }
std::string_view dtype_name(DType dtype) { return info(dtype).name; }
bool is_floating(DType dtype) {
  return dtype == DType::float32 || dtype == DType::float64 || dtype == DType::float16 ||
         dtype == DType::bfloat16;
}

DType dtype_from_name(std::string_view name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.dtype;
  fail(ErrorKind::type, "unknown dtype '", name, "'");
}

std::string dtype_list(const std::vector<DType>& dtypes) {
  std::string out = "[";
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (i) out += ", ";
    out += dtype_name(dtypes[i]);
  }
  return out + "]";
}

std::string device_type_name(DeviceType type) { return type == DeviceType::cpu ? "cpu" : "cuda"; }
std::string device_name(Device device) {
  if (device.type == DeviceType::cpu) return "cpu";
  return str(device_type_name(device.type), ":", device.index);
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t TensorView::size(int64_t dim) const { return shape[dim < 0 ? dim + rank() : dim]; }
int64_t TensorView::stride(int64_t dim) const { return strides[dim < 0 ? dim + rank() : dim]; }

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = rank() - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) return numel() == 0;
    expected *= shape[i];
  }
  return true;
}

Dims contiguous_strides(const Dims& shape) {
  Dims strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

Dims broadcast_strides(const TensorView& t, const Dims& shape) {
  Dims out(shape.size(), 0);
  const size_t lead = shape.size() - t.shape.size();
  for (size_t i = 0; i < t.shape.size(); ++i) out[lead + i] = t.shape[i] == 1 ? 0 : t.strides[i];
  return out;
}

std::optional<DType> dtype_from_dlpack(DLDataType dtype) {
  for (const auto& d : kDTypes)
    if (d.dl_code == dtype.code && d.size * 8 == dtype.bits && dtype.lanes == 1) return d.dtype;
  return std::nullopt;
}

TensorView from_dlpack(const DLTensor& t) {
  TensorView view;
  const std::optional<DType> dtype = dtype_from_dlpack(t.dtype);
  if (!dtype)
    fail(ErrorKind::type, "unsupported DLPack dtype (code ", int(t.dtype.code), ", bits ",
         int(t.dtype.bits), ", lanes ", t.dtype.lanes, ")");
  view.dtype = *dtype;
  switch (t.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      view.device = {DeviceType::cpu, 0};
      break;
    case kDLCUDA:
    case kDLCUDAManaged:
      view.device = {DeviceType::cuda, t.device.device_id};
      break;
    default:
      fail(ErrorKind::type, "unsupported DLPack device type ", int(t.device.device_type));
  }
  view.data = static_cast<char*>(t.data) + t.byte_offset;
  view.shape.assign(t.shape, t.shape + t.ndim);
  view.strides = t.strides ? Dims(t.strides, t.strides + t.ndim)
                           : contiguous_strides(view.shape);
  return view;
}

namespace {
struct DLPackHolder {
  DLManagedTensor managed;
  Dims shape, strides;
  void* owner;
  void (*release)(void*);
};
}  // namespace

DLManagedTensor* to_dlpack(const TensorView& view, void* owner, void (*release)(void*)) {
  auto holder = std::make_unique<DLPackHolder>();
  holder->shape = view.shape;
  holder->strides = view.strides;
  holder->owner = owner;
  holder->release = release;
  DLTensor& t = holder->managed.dl_tensor;
  t.data = view.data;
  t.device.device_type = view.device.type == DeviceType::cpu ? kDLCPU : kDLCUDA;
  t.device.device_id = view.device.index;
  t.ndim = static_cast<int32_t>(view.rank());
  t.dtype = {info(view.dtype).dl_code, static_cast<uint8_t>(info(view.dtype).size * 8), 1};
  t.shape = holder->shape.data();
  t.strides = holder->strides.data();
  t.byte_offset = 0;
  holder->managed.manager_ctx = holder.get();
  holder->managed.deleter = [](DLManagedTensor* self) {
    auto* h = static_cast<DLPackHolder*>(self->manager_ctx);
    if (h->release) h->release(h->owner);
    delete h;
  };
  return &holder.release()->managed;
}

}  // namespace opforge
