// Short rows, which the CPU walk hands to the kernels as blocks (for_each_row's Rows), on every
// SIMD target, with three threads so that chunks start and end inside rows, for row lengths that
// are whole vectors (the block loops) and ones that are not (row by row), bit for bit:
// - add and mul of a dense [R, C] operand and a [C] row repeated along it (a bias), either order,
//   one loop over each block with the row's index wrapping (binary-inl.h's DenseByRepeatedRow),
//   against the same op on the row materialized, in every dtype the ops take (both ops commute,
//   so the order is checked only as far as they show it);
// - activations, add/mul and activation gradients of narrow slices (x[:, :C] of a wider x),
//   one loop over each block's rows (activation-inl.h's MapUnaryRows), rows of half a vector two
//   to a vector (simd-inl.h's MapRowPairs), rows prefetched ahead where they skip cache lines,
//   against the same op on contiguous copies.
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

// op of `inputs` slices x[:, :cols] of x's `width` wide (the first input) against op of their
// contiguous copies; a second input is a slice too, or contiguous when `second_dense`.
template <typename T>
void expect_slices_equal_copies(const std::string& op, int inputs, bool second_dense, int64_t rows, int64_t width,
                                int64_t cols, std::mt19937& rng) {
  constexpr DType dtype = testing::dtype_of<T>();
  std::vector<std::vector<T>> xs(inputs), copies(inputs);
  OpInputs slices, contiguous;
  for (int k = 0; k < inputs; ++k) {
    const int64_t w = k == 1 && second_dense ? cols : width;
    xs[k].resize(rows * w);
    copies[k].resize(rows * cols);
    for (T& v : xs[k]) v = random_value<T>(rng);
    for (int64_t r = 0; r < rows; ++r) std::memcpy(&copies[k][r * cols], &xs[k][r * w], cols * sizeof(T));
    slices.tensors.emplace_back(view(xs[k], dtype, {rows, cols}, {w, 1}));
    contiguous.tensors.emplace_back(view(copies[k], dtype, {rows, cols}));
  }
  testing::add_default_attrs(op, slices);
  testing::add_default_attrs(op, contiguous);
  const auto got = run_op(op, slices).as<T>(), want = run_op(op, contiguous).as<T>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(T)), 0)
        << op << " of x[:, :" << cols << "] (x " << rows << " x " << width << ")"
        << (inputs == 2 ? (second_dense ? " and a contiguous operand" : " and another slice") : "") << ", element " << i;
}

// Widths whose rows are whole vectors on some target (16, 8, 64), half a vector on one (8 and 16
// on AVX-512, 4 on AVX2, 2 on SSE4: two rows to a vector) or neither (24, 7).
const std::vector<std::pair<int64_t, int64_t>> kSlices = {{32, 16}, {48, 8}, {128, 64}, {40, 24},
                                                          {17, 7},  {12, 4}, {6, 2}};

TEST_P(ShortRows, ActivationsOfNarrowSlicesEqualContiguousCopies) {
  std::mt19937 rng(29);
  for (const char* op : {"relu", "gelu", "silu", "add_one"})
    for (const auto& [width, cols] : kSlices) {
      const int64_t rows = 3 * 32768 / cols + 37;  // past three chunks, ending inside a row
      expect_slices_equal_copies<float>(op, 1, false, rows, width, cols, rng);
      expect_slices_equal_copies<double>(op, 1, false, rows, width, cols, rng);
      expect_slices_equal_copies<bfloat16>(op, 1, false, rows, width, cols, rng);
      expect_slices_equal_copies<float16>(op, 1, false, rows, width, cols, rng);
    }
}

TEST_P(ShortRows, BinaryOpsOfNarrowSlicesEqualContiguousCopies) {
  std::mt19937 rng(31);
  for (const char* op : {"add", "mul", "gelu_backward", "silu_backward"})
    for (const auto& [width, cols] : kSlices)
      for (bool second_dense : {false, true}) {
        const int64_t rows = 32768 / cols + 37;  // past one chunk
        expect_slices_equal_copies<float>(op, 2, second_dense, rows, width, cols, rng);
        expect_slices_equal_copies<double>(op, 2, second_dense, rows, width, cols, rng);
        expect_slices_equal_copies<bfloat16>(op, 2, second_dense, rows, width, cols, rng);
      }
}

INSTANTIATE_TEST_SUITE_P(EveryTarget, ShortRows, ::testing::ValuesIn(simd_targets_supported()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace opforge
