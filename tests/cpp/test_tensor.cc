// dtype and device names, TensorView geometry and the DLPack bridge. The expected values are
// spelled out here rather than derived from the tables under test.
#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "opforge/tensor.h"
#include "test_util.h"

namespace opforge {
namespace {

using testing::throws;
using testing::view;

TEST(DType, NamesAndSizes) {
  struct Expect {
    DType dtype;
    const char* name;
    int64_t size;
    bool floating;
  };
  const Expect table[] = {
      {DType::float32, "float32", 4, true}, {DType::float64, "float64", 8, true},
      {DType::float16, "float16", 2, true}, {DType::bfloat16, "bfloat16", 2, true},
      {DType::int8, "int8", 1, false},      {DType::uint8, "uint8", 1, false},
      {DType::int32, "int32", 4, false},    {DType::int64, "int64", 8, false},
      {DType::boolean, "bool", 1, false},
  };
  ASSERT_EQ(std::size(table), std::size(kAllDTypes));
  for (const auto& e : table) {
    SCOPED_TRACE(e.name);
    EXPECT_EQ(dtype_name(e.dtype), e.name);
    EXPECT_EQ(dtype_size(e.dtype), e.size);
    EXPECT_EQ(is_floating(e.dtype), e.floating);
    EXPECT_EQ(dtype_from_name(e.name), e.dtype);
  }
}

TEST(DType, UnknownNameIsTypeError) {
  EXPECT_TRUE(throws([] { dtype_from_name("float"); }, ErrorKind::type, "unknown dtype 'float'"));
  EXPECT_TRUE(throws([] { dtype_from_name("boolean"); }, ErrorKind::type, "unknown dtype 'boolean'"));
  EXPECT_TRUE(throws([] { dtype_from_name(""); }, ErrorKind::type, "unknown dtype ''"));
}

TEST(DType, List) {
  EXPECT_EQ(dtype_list({}), "[]");
  EXPECT_EQ(dtype_list({DType::int8}), "[int8]");
  EXPECT_EQ(dtype_list({DType::float16, DType::boolean}), "[float16, bool]");
}

TEST(Device, Names) {
  EXPECT_EQ(device_name({DeviceType::cpu, 0}), "cpu");
  EXPECT_EQ(device_name({DeviceType::cpu, 3}), "cpu");  // cpu has no index worth showing
  EXPECT_EQ(device_name({DeviceType::cuda, 0}), "cuda:0");
  EXPECT_EQ(device_name({DeviceType::cuda, 7}), "cuda:7");
  EXPECT_EQ(device_type_name(DeviceType::cuda), "cuda");
  EXPECT_TRUE((Device{DeviceType::cuda, 1} == Device{DeviceType::cuda, 1}));
  EXPECT_FALSE((Device{DeviceType::cuda, 1} == Device{DeviceType::cuda, 2}));
}

TEST(TensorView, Geometry) {
  TensorView t = view(nullptr, DType::float64, {2, 3, 4});
  EXPECT_EQ(t.rank(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 24 * 8);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.size(-3), 2);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(-2), 4);
  EXPECT_TRUE(t.is_contiguous());

  TensorView scalar = view(nullptr, DType::float32, {});
  EXPECT_EQ(scalar.rank(), 0);
  EXPECT_EQ(scalar.numel(), 1);  // a 0-d tensor holds one element
  EXPECT_TRUE(scalar.is_contiguous());

  EXPECT_EQ(view(nullptr, DType::float32, {2, 0, 3}).numel(), 0);
}

TEST(TensorView, Contiguity) {
  EXPECT_FALSE(view(nullptr, DType::float32, {3, 4}, {1, 3}).is_contiguous());  // transposed
  EXPECT_FALSE(view(nullptr, DType::float32, {3, 4}, {8, 1}).is_contiguous());  // row padding
  EXPECT_FALSE(view(nullptr, DType::float32, {4}, {0}).is_contiguous());        // broadcast
  // Size-1 dimensions can carry any stride without changing the memory layout.
  EXPECT_TRUE(view(nullptr, DType::float32, {3, 1, 4}, {4, 99, 1}).is_contiguous());
  EXPECT_TRUE(view(nullptr, DType::float32, {1, 1}, {7, 5}).is_contiguous());
  // An empty tensor touches no memory, so it is contiguous whatever its strides say.
  EXPECT_TRUE(view(nullptr, DType::float32, {3, 0}, {5, 7}).is_contiguous());
}

TEST(TensorView, ContiguousStrides) {
  EXPECT_EQ(contiguous_strides({}), Dims{});
  EXPECT_EQ(contiguous_strides({5}), Dims{1});
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Dims{12, 4, 1}));
  EXPECT_EQ(contiguous_strides({4, 1, 3}), (Dims{3, 3, 1}));
}

DLTensor dl_tensor(void* data, DLDataType dtype, Dims& shape, int64_t* strides) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = dtype;
  t.shape = shape.data();
  t.strides = strides;
  t.byte_offset = 0;
  return t;
}

TEST(DLPack, FromDLPackFoldsByteOffsetAndFillsStrides) {
  std::vector<float> data(16);
  Dims shape{2, 3};
  DLTensor t = dl_tensor(data.data(), {kDLFloat, 32, 1}, shape, nullptr);
  t.byte_offset = 8;  // two floats in
  TensorView v = from_dlpack(t);
  EXPECT_EQ(v.data, static_cast<void*>(data.data() + 2));
  EXPECT_EQ(v.dtype, DType::float32);
  EXPECT_EQ(v.device, (Device{DeviceType::cpu, 0}));
  EXPECT_EQ(v.shape, shape);
  EXPECT_EQ(v.strides, (Dims{3, 1}));  // null strides mean row-major

  Dims strides{1, 2};
  t.strides = strides.data();
  EXPECT_EQ(from_dlpack(t).strides, strides);
}

TEST(DLPack, Devices) {
  float x = 0;
  Dims shape{1};
  DLTensor t = dl_tensor(&x, {kDLFloat, 32, 1}, shape, nullptr);
  t.device = {kDLCUDA, 2};
  EXPECT_EQ(from_dlpack(t).device, (Device{DeviceType::cuda, 2}));
  t.device = {kDLCUDAManaged, 1};
  EXPECT_EQ(from_dlpack(t).device, (Device{DeviceType::cuda, 1}));
  t.device = {kDLCUDAHost, 0};  // pinned host memory is ordinary cpu memory to a kernel
  EXPECT_EQ(from_dlpack(t).device, (Device{DeviceType::cpu, 0}));
  t.device = {kDLOpenCL, 0};
  EXPECT_TRUE(throws([&] { from_dlpack(t); }, ErrorKind::type, "unsupported DLPack device type 4"));
}

TEST(DLPack, UnsupportedDTypesAreTypeErrors) {
  float x = 0;
  Dims shape{1};
  const DLDataType bad[] = {{kDLFloat, 8, 1}, {kDLFloat, 32, 4}, {kDLComplex, 64, 1},
                            {kDLUInt, 16, 1}, {kDLBfloat, 32, 1}};
  for (DLDataType d : bad) {
    DLTensor t = dl_tensor(&x, d, shape, nullptr);
    EXPECT_TRUE(throws([&] { from_dlpack(t); }, ErrorKind::type,
                       str("unsupported DLPack dtype (code ", int(d.code), ", bits ", int(d.bits),
                           ", lanes ", d.lanes, ")")));
  }
}

int release_calls = 0;
void* released_owner = nullptr;
void count_release(void* owner) {
  ++release_calls;
  released_owner = owner;
}

TEST(DLPack, ToDLPackRoundTripsEveryDType) {
  const DLDataType expected[] = {{kDLFloat, 32, 1}, {kDLFloat, 64, 1}, {kDLFloat, 16, 1},
                                 {kDLBfloat, 16, 1}, {kDLInt, 8, 1},   {kDLUInt, 8, 1},
                                 {kDLInt, 32, 1},    {kDLInt, 64, 1},  {6, 8, 1}};
  std::vector<double> storage(64);
  for (size_t i = 0; i < std::size(kAllDTypes); ++i) {
    const DType dtype = kAllDTypes[i];
    SCOPED_TRACE(dtype_name(dtype));
    TensorView v = view(storage.data(), dtype, {2, 3}, {1, 2});
    v.device = {DeviceType::cuda, 3};
    DLManagedTensor* m = to_dlpack(v, nullptr, nullptr);
    const DLTensor& t = m->dl_tensor;
    EXPECT_EQ(t.dtype.code, expected[i].code);
    EXPECT_EQ(t.dtype.bits, expected[i].bits);
    EXPECT_EQ(t.dtype.lanes, 1);
    EXPECT_EQ(dlpack_type_code(dtype), expected[i].code);
    EXPECT_EQ(t.device.device_type, kDLCUDA);
    EXPECT_EQ(t.device.device_id, 3);
    EXPECT_EQ(t.byte_offset, 0u);
    TensorView back = from_dlpack(t);
    EXPECT_EQ(back.data, v.data);
    EXPECT_EQ(back.dtype, dtype);
    EXPECT_EQ(back.device, v.device);
    EXPECT_EQ(back.shape, v.shape);
    EXPECT_EQ(back.strides, v.strides);
    m->deleter(m);  // no release callback: must not crash
  }
}

TEST(DLPack, ToDLPackOwnsShapeAndCallsRelease) {
  std::vector<float> data(6);
  TensorView v = view(data, DType::float32, {2, 3});
  int owner_token = 0;
  release_calls = 0;
  DLManagedTensor* m = to_dlpack(v, &owner_token, count_release);
  // The view's vectors may die before the consumer reads the capsule.
  v.shape = {9, 9, 9};
  v.strides = {0, 0, 0};
  ASSERT_EQ(m->dl_tensor.ndim, 2);
  EXPECT_EQ(m->dl_tensor.shape[0], 2);
  EXPECT_EQ(m->dl_tensor.shape[1], 3);
  EXPECT_EQ(m->dl_tensor.strides[0], 3);
  EXPECT_EQ(m->dl_tensor.strides[1], 1);
  EXPECT_EQ(release_calls, 0);
  m->deleter(m);
  EXPECT_EQ(release_calls, 1);
  EXPECT_EQ(released_owner, &owner_token);
}

}  // namespace
}  // namespace opforge
