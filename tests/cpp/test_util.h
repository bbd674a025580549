// Helpers shared by the C++ tests: error matching, views over std::vector storage, and a
// one-call path through validate -> select -> run that mirrors what the adapters do.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "opforge/backend.h"
#include "opforge/dispatch.h"
#include "opforge/error.h"
#include "opforge/half.h"
#include "opforge/parallel.h"
#include "opforge/registry.h"
#include "opforge/simd.h"
#include "opforge/tensor.h"

namespace opforge::testing {

// A test run once per SIMD target (its parameter; instantiate with
// ::testing::ValuesIn(simd_targets_supported())) with kThreads threads. With one, the kernels run
// on the test's thread, so its floating-point flags and the target it pinned are theirs; with
// more, the walks split into chunks that start and end inside rows.
template <int kThreads>
class OnEachTargetWithThreads : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    set_simd_target(GetParam());
    saved_threads_ = num_threads();
    set_num_threads(kThreads);
  }
  void TearDown() override {
    set_simd_target("");
    set_num_threads(saved_threads_);
  }

 private:
  int64_t saved_threads_ = 1;
};
using OnEachTargetOneThread = OnEachTargetWithThreads<1>;

// Offset of row-major linear index `linear` over `shape` for `strides`, by unravelling.
inline int64_t naive_offset(int64_t linear, const Dims& shape, const Dims& strides) {
  int64_t offset = 0;
  for (size_t d = shape.size(); d-- > 0;) {
    offset += (linear % shape[d]) * strides[d];
    linear /= shape[d];
  }
  return offset;
}

// Strides of a random view of `shape`: a contiguous buffer of a larger shape, sliced with
// steps, its dimensions permuted, some broadcast (stride 0).
inline Dims random_strides(const Dims& shape, std::mt19937& rng) {
  const size_t rank = shape.size();
  std::vector<size_t> order(rank);
  std::iota(order.begin(), order.end(), 0);
  if (rng() % 2) std::shuffle(order.begin(), order.end(), rng);
  Dims strides(rank);
  int64_t step = 1;
  for (size_t i = rank; i-- > 0;) {
    const size_t d = order[i];
    const int64_t slice = rng() % 4 == 0 ? 2 : 1;
    strides[d] = step * slice;
    step *= shape[d] * slice + (rng() % 3 == 0 ? 1 : 0);
  }
  for (size_t d = 0; d < rank; ++d)
    if (rng() % 6 == 0) strides[d] = 0;
  return strides;
}

inline const char* kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::type: return "type";
    case ErrorKind::value: return "value";
    case ErrorKind::not_implemented: return "not_implemented";
    case ErrorKind::runtime: return "runtime";
  }
  return "?";
}

// Passes when f throws opforge::Error of `kind` whose message contains `needle`. A failure
// prints what was thrown instead, so a reworded message is easy to spot.
template <typename F>
::testing::AssertionResult throws(F&& f, ErrorKind kind, std::string_view needle) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (e.kind() != kind)
      return ::testing::AssertionFailure() << "kind " << kind_name(e.kind()) << " (wanted "
                                           << kind_name(kind) << "): " << msg;
    if (msg.find(needle) == std::string::npos)
      return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << needle << "\"";
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-opforge exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw (wanted \"" << needle << "\")";
}

// The message f throws as opforge::Error, or "" (with a test failure) if it does not.
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an opforge::Error";
  return "";
}

// A CUDA-typed backend that is never available, like the real one on a machine without GPUs;
// registered once per test binary, as a device plugin would register its backend.
class FakeGpu final : public Backend {
 public:
  std::string name() const override { return "fake_gpu"; }
  DeviceType device_type() const override { return DeviceType::cuda; }
  bool available() const override { return false; }
  std::string unavailable_reason() const override { return "fake device for tests"; }
  int score() const override { return 5; }
  int64_t device_count() const override { return 0; }
  void* allocate(int64_t, Device, void*) override { return nullptr; }
  void release(void*, Device, void*) noexcept override {}
  void copy(void*, const void*, int64_t, void*) override {}
  void synchronize(Device, void*) override {}
};
[[maybe_unused]] inline const bool fake_gpu_registered = [] {
  register_backend(std::make_unique<FakeGpu>());
  return true;
}();

inline TensorView view(void* data, DType dtype, Dims shape, Dims strides = {}, Device device = {}) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.strides = strides.empty() && !shape.empty() ? contiguous_strides(shape) : std::move(strides);
  t.shape = std::move(shape);
  return t;
}

template <typename T>
TensorView view(std::vector<T>& storage, DType dtype, Dims shape, Dims strides = {}) {
  return view(storage.data(), dtype, std::move(shape), std::move(strides));
}

// The DType of element type T.
template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::float32;
  else if constexpr (std::is_same_v<T, double>) return DType::float64;
  else if constexpr (std::is_same_v<T, float16>) return DType::float16;
  else if constexpr (std::is_same_v<T, bfloat16>) return DType::bfloat16;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::int32;
  else {
    static_assert(std::is_same_v<T, int64_t>);
    return DType::int64;
  }
}

// A random element for the bitwise layout tests: integers in [-1000, 1000], floats uniform in
// (-3.5, 3.5), inside every activation's tables, so that a lane's result never depends on the
// lanes that share its vector (exact gelu takes its tables only when all lanes are inside).
template <typename T>
T random_value(std::mt19937& rng) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(std::uniform_int_distribution<int>(-1000, 1000)(rng));
  const double v = std::uniform_real_distribution<double>(-3.5, 3.5)(rng);
  if constexpr (std::is_same_v<T, bfloat16>) return to_bfloat16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, float16>) return to_float16(static_cast<float>(v));
  else return static_cast<T>(v);
}

// Appends op's attributes at their defaults to `in` (after its tensors).
inline void add_default_attrs(std::string_view op, OpInputs& in) {
  for (const ArgSpec& spec : find_op(op).schema().args)
    if (!spec.is_tensor()) in.attrs.push_back(*spec.default_value);
}

// Runs op `name` as an adapter would: validate, allocate contiguous results, pick a kernel,
// call it. Results come back as raw bytes, one vector per result.
struct Result {
  Outputs specs;
  std::vector<std::vector<unsigned char>> bytes;

  template <typename T>
  std::vector<T> as(size_t i = 0) const {
    std::vector<T> out(bytes[i].size() / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), bytes[i].data(), bytes[i].size());
    return out;
  }
};

inline Result run_op(std::string_view name, const OpInputs& inputs) {
  const OpDef& op = find_op(name);
  Result r;
  r.specs = infer_outputs(op, inputs);
  std::vector<TensorView> outs;
  for (const auto& spec : r.specs) {
    int64_t n = 1;
    for (int64_t s : spec.shape) n *= s;
    r.bytes.emplace_back(static_cast<size_t>(n * dtype_size(spec.dtype)));
  }
  for (size_t i = 0; i < r.specs.size(); ++i)
    outs.push_back(view(r.bytes[i].data(), r.specs[i].dtype, r.specs[i].shape));
  run_kernel(op, select_kernel(op, inputs), inputs, outs, nullptr);
  return r;
}

}  // namespace opforge::testing
