// The validator (infer_outputs) through the real ops add, add_one and rms_norm: each check's
// exact message and ErrorKind, since those become the Python exceptions users read.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "opforge/dispatch.h"
#include "opforge/registry.h"
#include "test_util.h"

namespace opforge {
namespace {

using testing::error_message;
using testing::throws;

// Storage big enough for every view below; the validator never reads the data.
std::vector<double> storage(64, 1.0);

TensorView t(DType dtype, Dims shape, Device device = {}) {
  return testing::view(storage.data(), dtype, std::move(shape), {}, device);
}

OpInputs rms(TensorView x, TensorView w, double eps = 1e-6) { return {{x, w}, {eps}}; }
OpInputs add(TensorView x, TensorView y) { return {{x, y}, {}}; }

void expect_error(const char* op, const OpInputs& in, ErrorKind kind, const std::string& message) {
  EXPECT_TRUE(throws([&] { infer_outputs(find_op(op), in); }, kind, message));
  EXPECT_EQ(error_message([&] { infer_outputs(find_op(op), in); }), message);  // whole text
}

TEST(Validate, AcceptsAndInfersShapes) {
  Outputs o = infer_outputs(find_op("rms_norm"), rms(t(DType::float32, {3, 5}), t(DType::float32, {5})));
  ASSERT_EQ(o.size(), 1u);
  EXPECT_EQ(o[0].dtype, DType::float32);
  EXPECT_EQ(o[0].shape, (Dims{3, 5}));

  o = infer_outputs(find_op("add_one"), {{t(DType::int64, {2, 0, 4})}, {}});
  EXPECT_EQ(o[0].dtype, DType::int64);
  EXPECT_EQ(o[0].shape, (Dims{2, 0, 4}));

  o = infer_outputs(find_op("rms_norm"), rms(t(DType::bfloat16, {5}), t(DType::bfloat16, {5}), 0.0));
  EXPECT_EQ(o[0].dtype, DType::bfloat16);
}

TEST(Validate, AddBroadcasts) {
  struct Case {
    Dims x, y, out;
  };
  const Case cases[] = {
      {{2, 1, 3}, {4, 1}, {2, 4, 3}}, {{}, {3}, {3}},       {{3}, {}, {3}},
      {{0}, {1}, {0}},                {{2, 0}, {1}, {2, 0}}, {{1, 1}, {1}, {1, 1}},
      {{5, 4}, {5, 4}, {5, 4}},
  };
  for (const auto& c : cases) {
    Outputs o = infer_outputs(find_op("add"), add(t(DType::float64, c.x), t(DType::float64, c.y)));
    EXPECT_EQ(o[0].shape, c.out) << ::testing::PrintToString(c.x) << " + " << ::testing::PrintToString(c.y);
  }
}

TEST(Validate, DtypeNotAllowed) {
  expect_error("rms_norm", rms(t(DType::int32, {3, 5}), t(DType::int32, {5})), ErrorKind::type,
               "rms_norm(): 'x' must have dtype in [float32, float64, float16, bfloat16], got int32");
  expect_error("add", add(t(DType::int8, {3}), t(DType::int8, {3})), ErrorKind::type,
               "add(): 'x' must have dtype in [float32, float64, float16, bfloat16, int32, int64], got int8");
  expect_error("add_one", {{t(DType::boolean, {3})}, {}}, ErrorKind::type,
               "add_one(): 'x' must have dtype in [float32, float64, float16, bfloat16, int32, int64], got bool");
}

TEST(Validate, SameDtype) {
  expect_error("add", add(t(DType::float32, {3}), t(DType::float64, {3})), ErrorKind::type,
               "add(): 'y' must have dtype float32 like 'x', got float64");
  expect_error("rms_norm", rms(t(DType::float16, {2, 5}), t(DType::bfloat16, {5})), ErrorKind::type,
               "rms_norm(): 'weight' must have dtype float16 like 'x', got bfloat16");
}

TEST(Validate, Rank) {
  expect_error("rms_norm", rms(t(DType::float32, {}), t(DType::float32, {1})), ErrorKind::value,
               "rms_norm(): 'x' must have rank >= 1, got rank 0 (shape [])");
  expect_error("rms_norm", rms(t(DType::float32, {3, 5}), t(DType::float32, {1, 5})), ErrorKind::value,
               "rms_norm(): 'weight' must have rank 1, got rank 2 (shape [1, 5])");
  expect_error("rms_norm", rms(t(DType::float32, {3, 5}), t(DType::float32, {})), ErrorKind::value,
               "rms_norm(): 'weight' must have rank 1, got rank 0 (shape [])");
}

TEST(Validate, Shape) {
  expect_error("rms_norm", rms(t(DType::float32, {3, 5}), t(DType::float32, {4})), ErrorKind::value,
               "rms_norm(): 'weight' must have shape [5], got [4]");
  expect_error("rms_norm", rms(t(DType::float64, {2, 3, 0}), t(DType::float64, {3})), ErrorKind::value,
               "rms_norm(): 'weight' must have shape [0], got [3]");
  expect_error("add_one", {{t(DType::float32, {2, -1})}, {}}, ErrorKind::value,
               "add_one(): 'x' has a negative size in shape [2, -1]");
}

TEST(Validate, BroadcastFailure) {
  expect_error("add", add(t(DType::float32, {2, 3}), t(DType::float32, {4})), ErrorKind::value,
               "add(): 'x' of shape [2, 3] and 'y' of shape [4] cannot be broadcast together");
  expect_error("add", add(t(DType::int32, {0}), t(DType::int32, {2})), ErrorKind::value,
               "add(): 'x' of shape [0] and 'y' of shape [2] cannot be broadcast together");
}

TEST(Validate, DeviceMismatch) {
  const Device gpu{DeviceType::cuda, 1};
  expect_error("add", add(t(DType::float32, {3}), t(DType::float32, {3}, gpu)), ErrorKind::runtime,
               "add(): 'y' is on cuda:1 but 'x' is on cpu; all tensors must be on one device");
  expect_error("rms_norm", rms(t(DType::float32, {2, 3}, gpu), t(DType::float32, {3}, {DeviceType::cuda, 0})),
               ErrorKind::runtime,
               "rms_norm(): 'weight' is on cuda:0 but 'x' is on cuda:1; all tensors must be on one device");
  // Same device everywhere is fine even when it is not the cpu: devices are checked later.
  EXPECT_NO_THROW(infer_outputs(find_op("add"), add(t(DType::float32, {3}, gpu), t(DType::float32, {3}, gpu))));
}

TEST(Validate, Eps) {
  expect_error("rms_norm", rms(t(DType::float32, {2, 3}), t(DType::float32, {3}), -1.0), ErrorKind::value,
               "rms_norm(): 'eps' must be >= 0, got -1");
  expect_error("rms_norm", rms(t(DType::float32, {2, 3}), t(DType::float32, {3}), std::nan("")),
               ErrorKind::value, "rms_norm(): 'eps' must be >= 0, got nan");
}

TEST(Validate, MissingTensorAndWrongArity) {
  expect_error("add", {{std::nullopt, t(DType::float32, {3})}, {}}, ErrorKind::type,
               "add(): 'x' must be a tensor, got None");
  // Arity is the adapter's job; a mismatch here is an opforge bug, reported as such.
  EXPECT_TRUE(throws([] { infer_outputs(find_op("add"), {{t(DType::float32, {3})}, {}}); },
                     ErrorKind::runtime, "tensor count mismatch for add"));
  EXPECT_TRUE(throws([] { infer_outputs(find_op("rms_norm"), {{t(DType::float32, {3}), t(DType::float32, {3})}, {}}); },
                     ErrorKind::runtime, "attribute count mismatch for rms_norm"));
}

TEST(Validate, FirstFailingCheckWins) {
  // Dtype is checked before rank, rank before shape: the message names the first problem.
  EXPECT_EQ(error_message([] { infer_outputs(find_op("rms_norm"), rms(t(DType::int64, {}), t(DType::int32, {7}))); }),
            "rms_norm(): 'x' must have dtype in [float32, float64, float16, bfloat16], got int64");
}

TEST(Validate, ArgAccess) {
  const OpDef& op = find_op("rms_norm");
  OpInputs in = rms(t(DType::float32, {2, 3}), t(DType::float32, {3}), 0.25);
  ArgAccess a(op, in);
  EXPECT_EQ(a.attr_float("eps"), 0.25);
  EXPECT_EQ(a.tensor("weight").shape, (Dims{3}));
  EXPECT_TRUE(throws([&] { a.tensor("bias"); }, ErrorKind::runtime, "rms_norm(): no tensor argument 'bias'"));
  EXPECT_TRUE(throws([&] { a.attr_float("alpha"); }, ErrorKind::runtime, "rms_norm(): no attribute 'alpha'"));
  EXPECT_TRUE(throws([&] { a.attr_float("x"); }, ErrorKind::runtime, "no attribute 'x'"));
  EXPECT_TRUE(throws([&] { a.fail(ErrorKind::value, "custom ", 3); }, ErrorKind::value, "rms_norm(): custom 3"));
}

}  // namespace
}  // namespace opforge
