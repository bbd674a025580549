// Short rows, which the CPU walk hands to the kernels as blocks (for_each_row's Rows), on every
// SIMD target, with three threads so that chunks start and end inside rows, for row lengths that
// are whole vectors (the block loops) and ones that are not (row by row), bit for bit:
// - add and mul of a dense [R, C] operand and a [C] row repeated along it (a bias), either order,
//   one loop over each block with the row's index wrapping (binary-inl.h's DenseByRepeatedRow),
//   against the same op on the row materialized, in every dtype the ops take (both ops commute,
//   so the order is checked only as far as they show it);
// - activations of narrow slices (x[:, :C] of a wider x), one loop over each block's rows
//   (activation-inl.h's MapUnaryRows), against the same op on a contiguous copy.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "test_util.h"

namespace opforge {
namespace {

using testing::random_value;
using testing::run_op;
using testing::view;

class ShortRows : public testing::OnEachTargetWithThreads<3> {};

template <typename T>
void expect_repeated_row_equals_materialized(const std::string& op, int64_t rows, int64_t cols, bool row_first,
                                             std::mt19937& rng) {
  constexpr DType dtype = testing::dtype_of<T>();
  std::vector<T> dense(rows * cols), row(cols), expanded(rows * cols);
  for (T& v : dense) v = random_value<T>(rng);
  for (T& v : row) v = random_value<T>(rng);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(&expanded[r * cols], row.data(), cols * sizeof(T));
  OpInputs repeated, materialized;
  auto dense_view = view(dense, dtype, {rows, cols});
  auto row_view = view(row, dtype, {cols});
  auto expanded_view = view(expanded, dtype, {rows, cols});
  repeated.tensors.emplace_back(row_first ? row_view : dense_view);
  repeated.tensors.emplace_back(row_first ? dense_view : row_view);
  materialized.tensors.emplace_back(row_first ? expanded_view : dense_view);
  materialized.tensors.emplace_back(row_first ? dense_view : expanded_view);
  const auto got = run_op(op, repeated).as<T>(), want = run_op(op, materialized).as<T>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(T)), 0)
        << op << " [" << rows << ", " << cols << "] " << (row_first ? "row first" : "row second") << ", element " << i;
}

TEST_P(ShortRows, AddAndMulOfARepeatedRowEqualTheRowMaterialized) {
  std::mt19937 rng(23);
  for (const char* op : {"add", "mul"})
    for (int64_t cols : {8, 16, 24, 64, 80, 7, 33})
      for (bool row_first : {false, true}) {
        // Past three of the walk's 32768-element chunks, ending inside a row.
        const int64_t rows = 3 * 32768 / cols + 37;
        expect_repeated_row_equals_materialized<float>(op, rows, cols, row_first, rng);
        expect_repeated_row_equals_materialized<double>(op, rows, cols, row_first, rng);
        expect_repeated_row_equals_materialized<bfloat16>(op, rows, cols, row_first, rng);
        expect_repeated_row_equals_materialized<float16>(op, rows, cols, row_first, rng);
        expect_repeated_row_equals_materialized<int32_t>(op, rows, cols, row_first, rng);
        expect_repeated_row_equals_materialized<int64_t>(op, rows, cols, row_first, rng);
      }
}

template <typename T>
void expect_slice_equals_copy(const std::string& op, int64_t rows, int64_t width, int64_t cols, std::mt19937& rng) {
  constexpr DType dtype = testing::dtype_of<T>();
  std::vector<T> x(rows * width), copy(rows * cols);
  for (T& v : x) v = random_value<T>(rng);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(&copy[r * cols], &x[r * width], cols * sizeof(T));
  OpInputs slice, contiguous;
  slice.tensors.emplace_back(view(x, dtype, {rows, cols}, {width, 1}));
  contiguous.tensors.emplace_back(view(copy, dtype, {rows, cols}));
  testing::add_default_attrs(op, slice);
  testing::add_default_attrs(op, contiguous);
  const auto got = run_op(op, slice).as<T>(), want = run_op(op, contiguous).as<T>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(T)), 0)
        << op << " of x[:, :" << cols << "] (x " << rows << " x " << width << "), element " << i;
}

TEST_P(ShortRows, ActivationsOfNarrowSlicesEqualContiguousCopies) {
  std::mt19937 rng(29);
  for (const char* op : {"relu", "gelu", "silu", "add_one"})
    for (const auto& [width, cols] : std::vector<std::pair<int64_t, int64_t>>{{32, 16}, {48, 8}, {128, 64}, {40, 24}, {17, 7}}) {
      const int64_t rows = 3 * 32768 / cols + 37;  // past three chunks, ending inside a row
      expect_slice_equals_copy<float>(op, rows, width, cols, rng);
      expect_slice_equals_copy<double>(op, rows, width, cols, rng);
      expect_slice_equals_copy<bfloat16>(op, rows, width, cols, rng);
      expect_slice_equals_copy<float16>(op, rows, width, cols, rng);
    }
}

INSTANTIATE_TEST_SUITE_P(EveryTarget, ShortRows, ::testing::ValuesIn(simd_targets_supported()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace opforge
