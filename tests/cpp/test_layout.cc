// The layout of elementwise ops' results (opforge/layout.h): the rule against torch's own
// results' strides (quoted from torch 2.13: x.T + y, a channels-last tensor plus a broadcast row,
// ...), and ops on reordered results against the same op on row-major ones, value for value.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "opforge/dispatch.h"
#include "opforge/layout.h"
#include "opforge/registry.h"
#include "test_util.h"

namespace opforge {
namespace {

using testing::view;
using V = Dims;

V strides_for(const std::vector<TensorView>& operands, const V& shape) {
  std::vector<const TensorView*> p;
  for (const auto& t : operands) p.push_back(&t);
  return elementwise_result_strides(p, shape);
}

TensorView t(V shape, V strides) { return view(nullptr, DType::float32, std::move(shape), std::move(strides)); }

TEST(Layout, RowMajorInputsGiveRowMajorResults) {
  EXPECT_EQ(strides_for({t({3, 4}, {4, 1})}, {3, 4}), (V{4, 1}));
  EXPECT_EQ(strides_for({t({2, 3, 4}, {12, 4, 1}), t({4}, {1})}, {2, 3, 4}), (V{12, 4, 1}));
  EXPECT_EQ(strides_for({t({5}, {3})}, {5}), (V{1}));          // rank 1: nothing to order
  EXPECT_EQ(strides_for({t({3, 0}, {1, 3})}, {3, 0}), (V{0, 1}));  // empty: row-major
  EXPECT_EQ(strides_for({t({}, {}), t({}, {})}, {}), (V{}));
}

TEST(Layout, ResultsFollowTheirInputs) {
  // torch: x.T.relu().stride() == (1, 4) for x of shape [3, 4]; slices keep their order.
  EXPECT_EQ(strides_for({t({4, 3}, {1, 4})}, {4, 3}), (V{1, 4}));
  EXPECT_EQ(strides_for({t({4, 3}, {2, 8})}, {4, 3}), (V{1, 4}));
  // torch: a [2, 3, 4, 5] tensor permuted (0, 2, 3, 1) (channels-last), relu and + a row of 3:
  // strides (60, 5, 1, 20).
  const TensorView nhwc = t({2, 4, 5, 3}, {60, 5, 1, 20});
  EXPECT_EQ(strides_for({nhwc}, {2, 4, 5, 3}), (V{60, 5, 1, 20}));
  EXPECT_EQ(strides_for({nhwc, t({3}, {1})}, {2, 4, 5, 3}), (V{60, 5, 1, 20}));
  EXPECT_EQ(strides_for({t({3}, {1}), nhwc}, {2, 4, 5, 3}), (V{60, 5, 1, 20}));  // a broadcast row decides nothing
  // NumPy's reversed views step backwards: magnitudes order them.
  EXPECT_EQ(strides_for({t({4, 3}, {-1, -4})}, {4, 3}), (V{1, 4}));
  EXPECT_EQ(strides_for({t({3, 4}, {-4, -1})}, {3, 4}), (V{4, 1}));
}

TEST(Layout, TheFirstOperandThatOrdersAPairDecidesIt) {
  // torch: (x.T + y).stride() == (1, 4) and (y + x.T).stride() == (3, 1), x [3, 4], y [4, 3].
  const TensorView xt = t({4, 3}, {1, 4}), y = t({4, 3}, {3, 1});
  EXPECT_EQ(strides_for({xt, y}, {4, 3}), (V{1, 4}));
  EXPECT_EQ(strides_for({y, xt}, {4, 3}), (V{3, 1}));
  // A column [4, 1] orders nothing (one dimension of size 1): the transposed second operand does.
  EXPECT_EQ(strides_for({t({4, 1}, {1, 1}), xt}, {4, 3}), (V{1, 4}));
}

TEST(Layout, SizeOneDimensionsDecideNothing) {
  // [3, 1, 4] transposed to [4, 1, 3]: the size-1 dimension's stride (999) orders nothing; the
  // result's is the product of the sizes inside it, as any dense stride there.
  EXPECT_EQ(strides_for({t({4, 1, 3}, {1, 999, 4})}, {4, 1, 3}), (V{1, 4, 4}));
  EXPECT_EQ(strides_for({t({2, 1}, {1, 7})}, {2, 1}), (V{1, 1}));
}

// Every result stride set is dense: a reordering of row-major strides over the same shape.
bool dense(const V& shape, const V& strides) {
  std::vector<size_t> order(shape.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return strides[a] != strides[b] ? strides[a] < strides[b] : shape[a] == 1 && shape[b] != 1;
  });
  int64_t step = 1;
  for (size_t d : order) {
    if (shape[d] != 1 && strides[d] != step) return false;
    step *= shape[d];
  }
  return true;
}

TEST(Layout, RandomLayoutsGiveDenseResultsInTheFirstOperandsOrder) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    const int rank = 2 + int(rng() % 3);
    V shape(rank);
    for (auto& s : shape) s = 1 + int64_t(rng() % 4);
    const TensorView x = t(shape, testing::random_strides(shape, rng));
    const V out = strides_for({x}, shape);
    ASSERT_TRUE(dense(shape, out)) << ::testing::PrintToString(out);
    // Where x steps through two dimensions (both longer than 1, neither broadcast), the result
    // steps through them in the same order.
    for (int a = 0; a < rank; ++a)
      for (int b = 0; b < rank; ++b)
        if (shape[a] > 1 && shape[b] > 1 && x.strides[a] != 0 && x.strides[b] != 0 && x.strides[a] < x.strides[b])
          EXPECT_LT(out[a], out[b]) << ::testing::PrintToString(x.strides);
  }
}

// An elementwise op writing a reordered result (the kernel sees the views reordered) against the
// same op writing a row-major one: the same value at every index.
void expect_same_as_row_major(const std::string& op, const std::vector<TensorView>& args, const V& shape) {
  OpInputs in;
  for (const auto& a : args) in.tensors.emplace_back(a);
  testing::add_default_attrs(op, in);
  const Outputs specs = infer_outputs(find_op(op), in);
  ASSERT_EQ(specs.size(), 1u);
  ASSERT_EQ(specs[0].shape, shape);
  ASSERT_NE(specs[0].strides, contiguous_strides(shape)) << "the case should reorder";
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<float> reordered(n, NAN), row_major(n, NAN);
  const Selection kernel = select_kernel(find_op(op), in);
  run_kernel(find_op(op), kernel, in, {{view(reordered, DType::float32, shape, specs[0].strides)}}, nullptr);
  run_kernel(find_op(op), kernel, in, {{view(row_major, DType::float32, shape)}}, nullptr);
  const V rs = specs[0].strides, cs = contiguous_strides(shape);
  for (int64_t i = 0; i < n; ++i) {
    int64_t at = 0, rest = i;
    for (size_t d = shape.size(); d-- > 0;) {
      at += (rest % shape[d]) * rs[d];
      rest /= shape[d];
    }
    ASSERT_EQ(reordered[at], row_major[i]) << op << " element " << i;
  }
}

TEST(Layout, KernelsWriteReorderedResults) {
  std::mt19937 rng(11);
  std::vector<float> a(2 * 37 * 70), b(70);
  for (auto& v : a) v = std::normal_distribution<float>()(rng);
  for (auto& v : b) v = std::normal_distribution<float>()(rng);
  // a as [70, 37] transposed, and as [2, 70, 37] with its last two dimensions swapped.
  const TensorView xt = view(a, DType::float32, {70, 37}, {1, 70});
  const TensorView x3 = view(a, DType::float32, {2, 70, 37}, {70 * 37, 1, 70});
  const TensorView column = view(b, DType::float32, {70, 1});
  for (const char* op : {"relu", "gelu", "silu", "add_one"}) {
    expect_same_as_row_major(op, {xt}, {70, 37});
    expect_same_as_row_major(op, {x3}, {2, 70, 37});
  }
  expect_same_as_row_major("add", {xt, column}, {70, 37});
  expect_same_as_row_major("mul", {x3, column}, {2, 70, 37});
  expect_same_as_row_major("mul", {column, x3}, {2, 70, 37});
  expect_same_as_row_major("gelu_backward", {x3, xt}, {2, 70, 37});
}

}  // namespace
}  // namespace opforge
