// Registration and kernel selection, with test-only ops declared here the way an op folder
// declares them (nothing central is edited) and the fake_gpu backend from test_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "opforge/dispatch.h"
#include "opforge/registry.h"
#include "test_util.h"

namespace {

using opforge::DType;

// test_scale: out = x * alpha. Validated for int32 too, but only float kernels exist, so the
// not_implemented path is reachable.
OPFORGE_OP(test_scale) {
  return opforge::OpDef("test_scale(Tensor x, float alpha=2.0) -> Tensor")
      .dtypes("x", {DType::float32, DType::float64, DType::int32})
      .shape([](const opforge::ShapeContext& c) { return opforge::Outputs{c.like("x")}; });
}

std::atomic<int> scale_calls{0};

void scale_cpu(const opforge::KernelCall& call) {
  ++scale_calls;
  const auto& x = call.tensor("x");
  const double alpha = call.attr_float("alpha");
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (x.dtype == DType::float32) call.output().data_as<float>()[i] = x.data_as<float>()[i] * float(alpha);
    else call.output().data_as<double>()[i] = x.data_as<double>()[i] * alpha;
  }
}
void scale_gpu(const opforge::KernelCall&) {}

OPFORGE_KERNEL(test_scale, "cpu", (std::vector<DType>{DType::float32, DType::float64}), scale_cpu);
OPFORGE_KERNEL(test_scale, "fake_gpu", (std::vector<DType>{DType::float32}), scale_gpu);

// test_pair: two results, so run_kernel's "every output empty" rule can be seen per result.
OPFORGE_OP(test_pair) {
  return opforge::OpDef("test_pair(Tensor x, Tensor y) -> (Tensor, Tensor)")
      .shape([](const opforge::ShapeContext& c) { return opforge::Outputs{c.like("x"), c.like("y")}; });
}
std::atomic<int> pair_calls{0};
void pair_cpu(const opforge::KernelCall& call) {
  ++pair_calls;
  EXPECT_EQ(call.num_outputs(), 2u);
}
OPFORGE_KERNEL(test_pair, "cpu", opforge::float_dtypes(), pair_cpu);

// test_checked: its kernel checks y's values (OpDef::validates), so it runs for an empty result
// while y has elements.
OPFORGE_OP(test_checked) {
  return opforge::OpDef("test_checked(Tensor x, Tensor y) -> Tensor")
      .validates({"y"})
      .shape([](const opforge::ShapeContext& c) { return opforge::Outputs{c.like("x")}; });
}
std::atomic<int> checked_calls{0};
void checked_cpu(const opforge::KernelCall&) { ++checked_calls; }
OPFORGE_KERNEL(test_checked, "cpu", opforge::float_dtypes(), checked_cpu);

// A shape rule that disagrees with its schema: an op author's bug, caught at the first call.
OPFORGE_OP(test_bad_rule) {
  return opforge::OpDef("test_bad_rule(Tensor x) -> (Tensor, Tensor)")
      .shape([](const opforge::ShapeContext& c) { return opforge::Outputs{c.like("x")}; });
}

}  // namespace

namespace opforge {
namespace {

using testing::throws;
using testing::view;

// Every test starts and ends without overrides.
class Dispatch : public ::testing::Test {
 protected:
  void SetUp() override { reload_config(); }
  void TearDown() override {
    set_backend_override("", "");
    reload_config();
  }
  std::vector<float> xs{1.5f, -2.0f, 3.25f};
  std::vector<float> out = std::vector<float>(3);
  OpInputs inputs(DType dtype = DType::float32, Device device = {}) {
    TensorView x = view(xs, dtype, {3});
    x.device = device;
    return {{x}, {2.0}};
  }
};

TEST_F(Dispatch, RegistrationIsVisible) {
  std::vector<std::string> names;
  for (const OpDef* op : all_ops()) names.push_back(op->name());
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  for (const char* n : {"add", "add_one", "rms_norm", "test_scale", "test_pair"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  EXPECT_EQ(&find_op("test_scale"), lookup_op("test_scale"));
  EXPECT_EQ(lookup_op("no_such_op"), nullptr);
  const std::string msg = testing::error_message([] { find_op("no_such_op"); });
  EXPECT_EQ(msg.rfind("unknown op 'no_such_op' (known ops: add, ", 0), 0u) << msg;
  EXPECT_NE(msg.find(", test_scale"), std::string::npos) << msg;
  // Every op in this binary, the test ops included, declared itself without error.
  EXPECT_EQ(registration_errors(), std::vector<std::string>{});

  const auto& kernels = kernels_of("test_scale");
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_EQ(kernels[0].backend, "cpu");
  EXPECT_EQ(kernels[0].dtypes, (std::vector<DType>{DType::float32, DType::float64}));
  EXPECT_EQ(kernels[0].fn, &scale_cpu);
  EXPECT_EQ(kernels[1].backend, "fake_gpu");
  EXPECT_TRUE(kernels_of("no_such_op").empty());
  ASSERT_NE(lookup_backend("cpu"), nullptr);
  EXPECT_TRUE(lookup_backend("cpu")->available());
  EXPECT_EQ(lookup_backend("fake_gpu")->device_type(), DeviceType::cuda);
  EXPECT_EQ(lookup_backend("tpu"), nullptr);
}

TEST_F(Dispatch, PicksCpuKernelAndRunsIt) {
  const OpDef& op = find_op("test_scale");
  OpInputs in = inputs();
  Selection s = select_kernel(op, in);
  EXPECT_EQ(s.backend->name(), "cpu");
  EXPECT_EQ(s.fn, &scale_cpu);
  TensorView o = view(out, DType::float32, {3});
  run_kernel(op, s, in, {&o, 1}, nullptr);
  EXPECT_EQ(out, (std::vector<float>{3.0f, -4.0f, 6.5f}));
  EXPECT_EQ(select_kernel(op, inputs(DType::float64)).fn, &scale_cpu);
}

TEST_F(Dispatch, NoKernelForDtype) {
  EXPECT_TRUE(throws([&] { select_kernel(find_op("test_scale"), inputs(DType::int32)); }, ErrorKind::not_implemented,
                     "test_scale(): no kernel for dtype int32 on cpu (kernels: cpu [float32, float64], "
                     "fake_gpu [float32])"));
  EXPECT_TRUE(throws([&] { select_kernel(find_op("test_bad_rule"), inputs()); }, ErrorKind::not_implemented,
                     "test_bad_rule(): no kernel for dtype float32 on cpu (the op has no kernels)"));
}

TEST_F(Dispatch, UnavailableBackendIsNamed) {
  EXPECT_TRUE(throws([&] { select_kernel(find_op("test_scale"), inputs(DType::float32, {DeviceType::cuda, 0})); },
                     ErrorKind::runtime,
                     "test_scale(): no available backend for dtype float32 on cuda:0 (fake_gpu: fake device for tests"));
}

TEST_F(Dispatch, OverrideNamesMustExist) {
  EXPECT_TRUE(throws([] { set_backend_override("test_scale", "tpu"); }, ErrorKind::value,
                     "set_backend() names unknown backend 'tpu' (known: "));
  const std::string msg = testing::error_message([] { set_backend_override("", "tpu"); });
  EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fake_gpu"), std::string::npos) << msg;
  EXPECT_TRUE(throws([] { set_backend_override("no_such_op", "cpu"); }, ErrorKind::value,
                     "set_backend() names unknown op 'no_such_op'"));
  EXPECT_EQ(backend_override("test_scale"), "");  // failed calls changed nothing
}

TEST_F(Dispatch, ForcedBackendOnWrongDevice) {
  set_backend_override("test_scale", "fake_gpu");
  EXPECT_EQ(backend_override("test_scale"), "fake_gpu");
  EXPECT_EQ(backend_override("add"), "");  // per-op: other ops are untouched
  EXPECT_TRUE(throws([&] { select_kernel(find_op("test_scale"), inputs()); }, ErrorKind::runtime,
                     "test_scale(): backend 'fake_gpu' (forced by set_backend()) cannot run on cpu tensors"));
  EXPECT_TRUE(throws([&] { select_kernel(find_op("test_scale"), inputs(DType::float32, {DeviceType::cuda, 0})); },
                     ErrorKind::runtime,
                     "test_scale(): backend 'fake_gpu' (forced by set_backend()) is not available: fake device for tests"));
  set_backend_override("test_scale", "");  // removes the override
  EXPECT_EQ(select_kernel(find_op("test_scale"), inputs()).backend->name(), "cpu");
}

TEST_F(Dispatch, ForcingCuda) {
  // The real CUDA backend exists only in CUDA builds; without it "cuda" is an unknown name.
  if (!lookup_backend("cuda")) {
    EXPECT_TRUE(throws([] { set_backend_override("", "cuda"); }, ErrorKind::value,
                       "set_backend() names unknown backend 'cuda' (known: "));
    return;
  }
  set_backend_override("", "cuda");
  EXPECT_TRUE(throws([&] { select_kernel(find_op("add_one"), inputs()); }, ErrorKind::runtime,
                     "add_one(): backend 'cuda' (forced by set_backend()) cannot run on cpu tensors"));
}

TEST_F(Dispatch, ForcedBackendWithoutKernel) {
  set_backend_override("", "cpu");  // every op
  EXPECT_EQ(backend_override("add"), "cpu");
  EXPECT_TRUE(throws([&] { select_kernel(find_op("test_scale"), inputs(DType::int32)); }, ErrorKind::not_implemented,
                     "test_scale(): backend 'cpu' (forced by set_backend()) has no kernel for dtype int32 on cpu"));
  // A per-op override beats the global one.
  set_backend_override("test_scale", "fake_gpu");
  EXPECT_EQ(backend_override("test_scale"), "fake_gpu");
  EXPECT_EQ(backend_override("rms_norm"), "cpu");
}

TEST_F(Dispatch, RunKernelSkipsOnlyWhenEveryOutputIsEmpty) {
  const OpDef& op = find_op("test_pair");
  std::vector<float> a(4), b(4);
  OpInputs in{{view(a, DType::float32, {0}), view(b, DType::float32, {2, 2})}, {}};
  Outputs specs = infer_outputs(op, in);
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].shape, Dims{0});
  EXPECT_EQ(specs[1].shape, (Dims{2, 2}));
  const Selection s = select_kernel(op, in);

  pair_calls = 0;
  TensorView mixed[] = {view(a, DType::float32, {0}), view(b, DType::float32, {2, 2})};
  run_kernel(op, s, in, mixed, nullptr);
  EXPECT_EQ(pair_calls, 1);
  TensorView empty[] = {view(a, DType::float32, {0}), view(b, DType::float32, {3, 0})};
  run_kernel(op, s, in, empty, nullptr);
  EXPECT_EQ(pair_calls, 1);  // nothing to write: the kernel is not called

  scale_calls = 0;
  const OpDef& scale = find_op("test_scale");
  OpInputs zero{{view(xs, DType::float32, {0})}, {2.0}};
  TensorView o = view(out, DType::float32, {0});
  run_kernel(scale, select_kernel(scale, zero), zero, {&o, 1}, nullptr);
  EXPECT_EQ(scale_calls, 0);
}

TEST_F(Dispatch, AnEmptyResultStillRunsTheKernelOfAnOpThatValidatesAnInput) {
  const OpDef& op = find_op("test_checked");
  EXPECT_EQ(op.validated_args(), std::vector<std::string>{"y"});
  std::vector<float> a(4), b(4);
  TensorView none = view(a, DType::float32, {0});
  checked_calls = 0;
  const OpInputs with_values{{none, view(b, DType::float32, {4})}, {}};
  run_kernel(op, select_kernel(op, with_values), with_values, {&none, 1}, nullptr);
  EXPECT_EQ(checked_calls, 1);  // y's values are checked though nothing is computed
  const OpInputs nothing{{none, view(b, DType::float32, {0})}, {}};
  run_kernel(op, select_kernel(op, nothing), nothing, {&none, 1}, nullptr);
  EXPECT_EQ(checked_calls, 1);  // no values to check either
  EXPECT_TRUE(throws([] { opforge::OpDef("test_v(Tensor x) -> Tensor").validates({"z"}); }, ErrorKind::runtime,
                     "unknown tensor argument 'z'"));
}

TEST_F(Dispatch, ShapeRuleResultCountIsChecked) {
  std::vector<float> a(2);
  EXPECT_TRUE(throws([&] { infer_outputs(find_op("test_bad_rule"), {{view(a, DType::float32, {2})}, {}}); },
                     ErrorKind::runtime, "test_bad_rule's shape rule returned 1 results, schema says 2"));
}

}  // namespace
}  // namespace opforge
