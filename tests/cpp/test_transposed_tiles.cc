// Elementwise ops whose inputs are transposed relative to their contiguous output (x.T + y,
// gelu_backward(grad.T, x)), which the CPU walk hands over as tiles read in L x L squares
// transposed in registers (transpose-inl.h's MapSquares), on every SIMD target with three
// threads: bit for bit against the same op on contiguous copies of the inputs, in every dtype
// the op takes, for shapes whose rows and columns are whole squares and ones that leave rows and
// columns over (walked row by row), beside contiguous, broadcast-row and broadcast-column
// operands, and in a batch of transposes. And the row ops (softmax, the norms, their backward
// ops, the quantizers) on transposed rows, which they read a panel at a time (rows-inl.h's
// RowSource).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <optional>
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

class TransposedTiles : public testing::OnEachTargetWithThreads<3> {};

// An input of a [batch, rows, cols] op: how it is laid out, and its contiguous copy.
enum class Layout { kTransposed, kContiguous, kRow, kColumn };

template <typename T>
struct Input {
  std::vector<T> data, copy;
  TensorView strided, contiguous;
};

template <typename T>
Input<T> make_input(Layout layout, int64_t batch, int64_t rows, int64_t cols, std::mt19937& rng) {
  constexpr DType dtype = testing::dtype_of<T>();
  Input<T> in;
  in.copy.resize(batch * rows * cols);
  switch (layout) {
    case Layout::kTransposed: {  // [batch, cols, rows] storage, its last two dims swapped
      in.data.resize(batch * rows * cols);
      for (T& v : in.data) v = random_value<T>(rng);
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) in.copy[(b * rows + r) * cols + c] = in.data[(b * cols + c) * rows + r];
      in.strided = view(in.data, dtype, {batch, rows, cols}, {rows * cols, 1, rows});
      break;
    }
    case Layout::kContiguous:
      in.data.resize(batch * rows * cols);
      for (T& v : in.data) v = random_value<T>(rng);
      in.copy = in.data;
      in.strided = view(in.data, dtype, {batch, rows, cols});
      break;
    case Layout::kRow:  // [cols], broadcast over batch and rows
      in.data.resize(cols);
      for (T& v : in.data) v = random_value<T>(rng);
      for (int64_t i = 0; i < batch * rows; ++i) std::memcpy(&in.copy[i * cols], in.data.data(), cols * sizeof(T));
      in.strided = view(in.data, dtype, {cols});
      break;
    case Layout::kColumn:  // [rows, 1], broadcast over batch and columns
      in.data.resize(rows);
      for (T& v : in.data) v = random_value<T>(rng);
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) in.copy[(b * rows + r) * cols + c] = in.data[r];
      in.strided = view(in.data, dtype, {rows, 1});
      break;
  }
  in.contiguous = view(in.copy, dtype, {batch, rows, cols});
  return in;
}

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kTransposed: return "transposed";
    case Layout::kContiguous: return "contiguous";
    case Layout::kRow: return "row";
    case Layout::kColumn: return "column";
  }
  return "?";
}

// op(inputs laid out so, then `tail`) against op(their contiguous copies, then `tail`), every
// result bit for bit.
template <typename T>
void expect_equals_contiguous(const std::string& op, const std::vector<Layout>& layouts, int64_t batch, int64_t rows,
                              int64_t cols, std::mt19937& rng, const std::vector<std::optional<TensorView>>& tail = {}) {
  std::vector<Input<T>> inputs;
  for (Layout l : layouts) inputs.push_back(make_input<T>(l, batch, rows, cols, rng));
  OpInputs strided, contiguous;
  for (const auto& in : inputs) {
    strided.tensors.push_back(in.strided);
    contiguous.tensors.push_back(in.contiguous);
  }
  for (const auto& t : tail) {
    strided.tensors.push_back(t);
    contiguous.tensors.push_back(t);
  }
  testing::add_default_attrs(op, strided);
  testing::add_default_attrs(op, contiguous);
  const testing::Result got = run_op(op, strided), want = run_op(op, contiguous);
  for (size_t k = 0; k < want.bytes.size(); ++k) {
    ASSERT_EQ(got.bytes[k].size(), want.bytes[k].size());
    const auto differ = std::mismatch(got.bytes[k].begin(), got.bytes[k].end(), want.bytes[k].begin());
    if (differ.first == got.bytes[k].end()) continue;
    const int64_t i = (differ.first - got.bytes[k].begin()) / dtype_size(want.specs[k].dtype);
    std::string what = op + "(";
    for (size_t j = 0; j < layouts.size(); ++j) what += (j ? ", " : "") + std::string(layout_name(layouts[j]));
    FAIL() << what << ") [" << batch << ", " << rows << ", " << cols << "] " << dtype_name(testing::dtype_of<T>())
           << ": result " << k << ", element " << i << " (of the result's last dimension: " << i % want.specs[k].shape.back()
           << ") differs";
  }
}

// Shapes: whole 128 x 128 tiles of whole squares; rows and columns left over past the squares
// and the tiles; a tile narrower than a vector (row by row); a batch of transposes; one past the
// walk's 32768-element grain, so the three threads split the tiles.
struct Shape {
  int64_t batch, rows, cols;
};
const std::vector<Shape> kShapes = {{1, 128, 128}, {1, 300, 261}, {1, 37, 45}, {1, 129, 5}, {3, 40, 72}, {1, 700, 610}};

template <typename T>
void expect_binary_ops(const std::string& op, std::mt19937& rng) {
  using L = Layout;
  const std::vector<std::vector<Layout>> cases = {{L::kTransposed, L::kContiguous}, {L::kContiguous, L::kTransposed},
                                                  {L::kTransposed, L::kTransposed}, {L::kTransposed, L::kRow},
                                                  {L::kColumn, L::kTransposed}};
  for (const Shape& s : kShapes)
    for (const auto& layouts : cases) expect_equals_contiguous<T>(op, layouts, s.batch, s.rows, s.cols, rng);
}

TEST_P(TransposedTiles, AddAndMulEqualContiguousCopies) {
  std::mt19937 rng(31);
  for (const char* op : {"add", "mul"}) {
    expect_binary_ops<float>(op, rng);
    expect_binary_ops<double>(op, rng);
    expect_binary_ops<bfloat16>(op, rng);
    expect_binary_ops<float16>(op, rng);
    expect_binary_ops<int32_t>(op, rng);
    expect_binary_ops<int64_t>(op, rng);
  }
}

TEST_P(TransposedTiles, ActivationsAndTheirGradientsEqualContiguousCopies) {
  std::mt19937 rng(37);
  using L = Layout;
  for (const Shape& s : kShapes) {
    for (const char* op : {"relu", "gelu", "silu", "add_one", "add_one_backward"}) {
      expect_equals_contiguous<float>(op, {L::kTransposed}, s.batch, s.rows, s.cols, rng);
      expect_equals_contiguous<double>(op, {L::kTransposed}, s.batch, s.rows, s.cols, rng);
      expect_equals_contiguous<bfloat16>(op, {L::kTransposed}, s.batch, s.rows, s.cols, rng);
      expect_equals_contiguous<float16>(op, {L::kTransposed}, s.batch, s.rows, s.cols, rng);
    }
    expect_equals_contiguous<int32_t>("add_one", {L::kTransposed}, s.batch, s.rows, s.cols, rng);
    expect_equals_contiguous<int64_t>("add_one", {L::kTransposed}, s.batch, s.rows, s.cols, rng);
    for (const auto& layouts : std::vector<std::vector<Layout>>{{L::kTransposed, L::kContiguous, L::kContiguous},
                                                                {L::kContiguous, L::kTransposed, L::kContiguous},
                                                                {L::kTransposed, L::kContiguous, L::kTransposed},
                                                                {L::kTransposed, L::kTransposed, L::kTransposed}})
      for (const char* op : {"add_backward", "mul_backward"}) {
        expect_equals_contiguous<float>(op, layouts, s.batch, s.rows, s.cols, rng);
        expect_equals_contiguous<double>(op, layouts, s.batch, s.rows, s.cols, rng);
        expect_equals_contiguous<bfloat16>(op, layouts, s.batch, s.rows, s.cols, rng);
      }
    for (const char* op : {"relu_backward", "gelu_backward", "silu_backward"})
      for (const auto& layouts : std::vector<std::vector<Layout>>{
               {L::kTransposed, L::kContiguous}, {L::kContiguous, L::kTransposed}, {L::kTransposed, L::kTransposed}}) {
        expect_equals_contiguous<float>(op, layouts, s.batch, s.rows, s.cols, rng);
        expect_equals_contiguous<double>(op, layouts, s.batch, s.rows, s.cols, rng);
        expect_equals_contiguous<bfloat16>(op, layouts, s.batch, s.rows, s.cols, rng);
      }
  }
}

// Row ops (softmax, the norms and their backward ops) on rows that sit side by side in memory
// (x.T): read a panel of rows at a time, transposed square by square (rows-inl.h's RowSource).
// Shapes: row lengths that leave columns past the squares, row counts that leave rows past the
// panels and chunks, matrices of a batch whose rows do not fill whole panels.
template <typename T>
void expect_row_ops(int64_t batch, int64_t rows, int64_t cols, std::mt19937& rng) {
  using L = Layout;
  constexpr DType dtype = testing::dtype_of<T>();
  std::vector<T> weight(cols), bias(cols);
  for (T& v : weight) v = random_value<T>(rng);
  for (T& v : bias) v = random_value<T>(rng);
  const TensorView w = view(weight, dtype, {cols}), b = view(bias, dtype, {cols});
  expect_equals_contiguous<T>("softmax", {L::kTransposed}, batch, rows, cols, rng);
  expect_equals_contiguous<T>("rms_norm", {L::kTransposed}, batch, rows, cols, rng, {w});
  expect_equals_contiguous<T>("layer_norm", {L::kTransposed}, batch, rows, cols, rng, {w, b});
  for (const auto& layouts : std::vector<std::vector<Layout>>{
           {L::kTransposed, L::kContiguous}, {L::kContiguous, L::kTransposed}, {L::kTransposed, L::kTransposed}}) {
    expect_equals_contiguous<T>("softmax_backward", layouts, batch, rows, cols, rng);
    expect_equals_contiguous<T>("rms_norm_backward", layouts, batch, rows, cols, rng, {w});
    expect_equals_contiguous<T>("layer_norm_backward", layouts, batch, rows, cols, rng, {w});
  }
}

TEST_P(TransposedTiles, QuantizersOfTransposedRowsEqualContiguousCopies) {
  std::mt19937 rng(43);
  for (const Shape& s : std::vector<Shape>{{1, 64, 64}, {1, 300, 96}, {1, 37, 512}, {3, 40, 32}, {1, 200, 2048}})
    for (const char* op : {"quantize_q8_0", "quantize_q4_0"}) {
      expect_equals_contiguous<float>(op, {Layout::kTransposed}, s.batch, s.rows, s.cols, rng);
      expect_equals_contiguous<bfloat16>(op, {Layout::kTransposed}, s.batch, s.rows, s.cols, rng);
      expect_equals_contiguous<float16>(op, {Layout::kTransposed}, s.batch, s.rows, s.cols, rng);
    }
}

TEST_P(TransposedTiles, RowOpsOfTransposedRowsEqualContiguousCopies) {
  std::mt19937 rng(41);
  for (const Shape& s : std::vector<Shape>{{1, 64, 64}, {1, 300, 261}, {1, 37, 45}, {3, 40, 72}, {2, 70, 33}, {1, 600, 512}}) {
    expect_row_ops<float>(s.batch, s.rows, s.cols, rng);
    expect_row_ops<double>(s.batch, s.rows, s.cols, rng);
    expect_row_ops<bfloat16>(s.batch, s.rows, s.cols, rng);
    expect_row_ops<float16>(s.batch, s.rows, s.cols, rng);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryTarget, TransposedTiles, ::testing::ValuesIn(simd_targets_supported()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace opforge
