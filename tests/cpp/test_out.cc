// out= (opforge/out.h): the out variant's schema as torch is given it, and the one rule every
// frontend checks the caller's tensors by, on views alone (the frontends' own tests run it from
// NumPy, torch, forge and torch.compile).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "opforge/dispatch.h"
#include "opforge/out.h"
#include "opforge/registry.h"
#include "test_util.h"

namespace opforge {
namespace {

using testing::throws;
using testing::view;
using V = Dims;
using Outs = std::vector<std::optional<TensorView>>;

TEST(OutVariant, OneOutPerResultAfterTheOpsArguments) {
  EXPECT_EQ(out_variant_schema(find_op("add")), "add.out(Tensor x, Tensor y, *, Tensor(a!) out) -> ()");
  EXPECT_EQ(out_arg_names(find_op("layer_norm_backward")), (std::vector<std::string>{"out0", "out1", "out2"}));
  const std::string schema = out_variant_schema(find_op("layer_norm_backward"));
  EXPECT_NE(schema.find(", *, Tensor(a!) out0, Tensor(b!) out1, Tensor(c!) out2) -> ()"), std::string::npos) << schema;
}

TEST(OutVariant, NamesStepAroundTheOpsOwnArguments) {
  const OpDef takes_out0("pair_with_out0(Tensor x, int out0=1) -> (Tensor, Tensor)");
  EXPECT_EQ(out_arg_names(takes_out0), (std::vector<std::string>{"_out0", "out1"}));
  EXPECT_EQ(out_variant_schema(takes_out0),
            "pair_with_out0.out(Tensor x, int out0=1, *, Tensor(a!) _out0, Tensor(b!) out1) -> ()");
  const OpDef no_args("constant() -> Tensor");
  EXPECT_EQ(out_variant_schema(no_args), "constant.out(*, Tensor(a!) out) -> ()");
  // An argument named out is the op's own: no out variant (out= would shadow it).
  const OpDef takes_out("writes(Tensor x, Tensor out) -> Tensor");
  EXPECT_TRUE(out_arg_names(takes_out).empty());
  EXPECT_EQ(out_variant_schema(takes_out), "");
}

class CheckOut : public ::testing::Test {
 protected:
  // Runs check_out for relu (elementwise) or rms_norm (row-major results) over x (and w).
  void check(const OpDef& op, const Outs& out) {
    OpInputs inputs;
    inputs.tensors.emplace_back(x);
    if (op.name() == "rms_norm") {
      inputs.tensors.emplace_back(view(w, DType::float32, {4}));
      inputs.attrs.emplace_back(1e-6);
    }
    const Outputs results = infer_outputs(op, inputs);
    std::vector<std::string> names;
    for (size_t i = 0; i < out.size(); ++i) names.push_back(out_name(i, out.size()));
    check_out(op, inputs, results, out, names);
  }
  std::vector<float> data = std::vector<float>(12), other = std::vector<float>(24), w = std::vector<float>(4, 1);
  TensorView x = view(data, DType::float32, {3, 4});
  const OpDef& relu = find_op("relu");
  const OpDef& rms_norm = find_op("rms_norm");
};

TEST_F(CheckOut, TheResultItselfPasses) {
  check(relu, {view(other, DType::float32, {3, 4})});
  check(relu, {std::nullopt});                                  // not given: allocated as usual
  check(relu, {view(other, DType::float32, {3, 4}, {1, 3})});   // elementwise: any dense order
  check(relu, {x});                                             // elementwise: in place
  check(rms_norm, {view(other, DType::float32, {3, 4})});
  check(relu, {view(nullptr, DType::float32, {3, 4})});         // metadata alone: no sharing to see
}

TEST_F(CheckOut, EachWayToBeWrongIsATypedError) {
  EXPECT_TRUE(throws([&] { check(relu, {view(other, DType::float64, {3, 4})}); }, ErrorKind::type,
                     "relu(): 'out' must have dtype float32, got float64"));
  EXPECT_TRUE(throws([&] { check(relu, {view(other, DType::float32, {4, 3})}); }, ErrorKind::value,
                     "relu(): 'out' must have shape [3, 4], got [4, 3]"));
  EXPECT_TRUE(throws([&] { check(relu, {view(other.data(), DType::float32, {3, 4}, {}, Device{DeviceType::cuda, 0})}); },
                     ErrorKind::runtime, "relu(): 'out' is on cuda:0 but the inputs are on cpu"));
  EXPECT_TRUE(throws([&] { check(relu, {view(other, DType::float32, {3, 4}, {8, 2})}); }, ErrorKind::value,
                     "relu(): 'out' must be dense (every element once"));
  EXPECT_TRUE(throws([&] { check(rms_norm, {view(other, DType::float32, {3, 4}, {1, 3})}); }, ErrorKind::value,
                     "rms_norm(): 'out' must be row-major (C-contiguous), got strides [1, 3] for shape [3, 4]"));
}

TEST_F(CheckOut, OnlyAnElementwiseInputItselfMayBeWritten) {
  EXPECT_TRUE(throws([&] { check(rms_norm, {x}); }, ErrorKind::value,
                     "rms_norm(): 'out' shares memory with 'x'; out= may not overlap an input"));
  // The same bytes in another order, or shifted by one element, are not "in place".
  EXPECT_TRUE(throws([&] { check(relu, {view(data.data() + 1, DType::float32, {3, 4}, {1, 3})}); }, ErrorKind::value,
                     "relu(): 'out' shares memory with 'x'; out= may be an elementwise input itself (in place)"));
  x = view(data, DType::float32, {3, 4}, {1, 3});  // a transposed input written in its own order: in place
  check(relu, {x});
  EXPECT_TRUE(throws([&] { check(relu, {view(data, DType::float32, {3, 4})}); }, ErrorKind::value,
                     "relu(): 'out' shares memory with 'x'"));
}

TEST(CheckOutOfSeveralResults, OutsMayNotShareMemoryWithEachOther) {
  const OpDef& op = find_op("add_backward");
  std::vector<float> g(12), a(12), b(12), out(12);
  OpInputs inputs;
  for (auto* storage : {&g, &a, &b}) inputs.tensors.emplace_back(view(*storage, DType::float32, {3, 4}));
  inputs.attrs.emplace_back(int64_t{-1});
  const Outputs results = infer_outputs(op, inputs);
  const std::vector<std::string> names{"out[0]", "out[1]"};
  const TensorView shared = view(out, DType::float32, {3, 4});
  check_out(op, inputs, results, Outs{shared, std::nullopt}, names);
  EXPECT_TRUE(throws([&] { check_out(op, inputs, results, Outs{shared, shared}, names); }, ErrorKind::value,
                     "add_backward(): 'out[1]' shares memory with 'out[0]'"));
}

TEST(OutCount, OnePerResultInASequenceOneArrayForOneResult) {
  check_out_count(find_op("add"), false, 1, "ndarray");
  check_out_count(find_op("add"), true, 1, "tuple");
  check_out_count(find_op("add_backward"), true, 2, "list");
  EXPECT_TRUE(throws([] { check_out_count(find_op("add"), true, 2, "list"); }, ErrorKind::type,
                     "add(): 'out' must hold 1 array (one per result), got a list of 2"));
  EXPECT_TRUE(throws([] { check_out_count(find_op("add_backward"), false, 1, "Tensor"); }, ErrorKind::type,
                     "add_backward(): 'out' must be a tuple of 2 arrays (one per result), got Tensor"));
  EXPECT_EQ(out_name(0, 1), "out");
  EXPECT_EQ(out_name(1, 3), "out[1]");
}

TEST(OutNeedsGrad, NamesTheTensorAndTheWayOut) {
  EXPECT_TRUE(throws([] { fail_out_needs_grad(find_op("relu"), "out"); }, ErrorKind::type,
                     "relu(): 'out' is a torch tensor that requires grad, and out= does not support autograd"));
}

}  // namespace
}  // namespace opforge
