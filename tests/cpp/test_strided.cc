// for_each_row and broadcast_strides against a naive walk over every multi-index. Shapes are
// random with size-1 (broadcast), size-0 and permuted (transposed) dimensions, and grains
// small enough that parallel chunks split rows.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "opforge/cpu/strided.h"
#include "opforge/parallel.h"
#include "test_util.h"

namespace opforge {
namespace {

using testing::naive_offset;
using testing::view;


int64_t numel(const Dims& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

TEST(Strided, BroadcastStridesExamples) {
  using V = Dims;
  EXPECT_EQ(broadcast_strides(view(nullptr, DType::float32, {3, 1}, {1, 1}), {2, 3, 4}), (V{0, 1, 0}));
  EXPECT_EQ(broadcast_strides(view(nullptr, DType::float32, {4}), {2, 3, 4}), (V{0, 0, 1}));
  EXPECT_EQ(broadcast_strides(view(nullptr, DType::float32, {}), {2, 3}), (V{0, 0}));
  EXPECT_EQ(broadcast_strides(view(nullptr, DType::float32, {2, 3}, {1, 2}), {2, 3}), (V{1, 2}));
}

TEST(Strided, OffsetOf) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    Dims shape, strides;
    const int rank = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int d = 0; d < rank; ++d) {
      shape.push_back(std::uniform_int_distribution<int64_t>(1, 5)(rng));
      strides.push_back(std::uniform_int_distribution<int64_t>(0, 40)(rng));
    }
    for (int64_t i = 0; i < numel(shape); ++i)
      ASSERT_EQ(cpu::offset_of(i, shape.data(), strides.data(), rank), naive_offset(i, shape, strides));
  }
}

// One random elementwise-op layout: a contiguous output, a broadcast operand and a
// permuted (non-contiguous) operand, all over `shape`.
struct Layout {
  Dims shape;
  std::array<Dims, 3> strides;
};

Layout random_layout(std::mt19937& rng) {
  Layout l;
  const int rank = std::uniform_int_distribution<int>(0, 5)(rng);
  std::uniform_int_distribution<int> pick(0, 9);
  for (int d = 0; d < rank; ++d) {
    const int p = pick(rng);
    l.shape.push_back(p == 0 ? 0 : p <= 3 ? 1 : p - 2);  // many 1s, some 0s, up to 7
  }
  l.strides[0] = contiguous_strides(l.shape);

  // Broadcast operand: drops some leading dimensions and has size 1 in random others.
  Dims bshape(l.shape.begin() + std::uniform_int_distribution<int>(0, rank)(rng), l.shape.end());
  for (auto& s : bshape)
    if (pick(rng) < 4) s = 1;
  TensorView b = view(nullptr, DType::float32, bshape);
  l.strides[1] = broadcast_strides(b, l.shape);

  // Permuted operand: a contiguous buffer of a permuted shape, viewed in `shape` order.
  std::vector<int> perm(rank);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  Dims pshape(rank);
  for (int d = 0; d < rank; ++d) pshape[d] = l.shape[perm[d]];
  const auto pstrides = contiguous_strides(pshape);
  l.strides[2].resize(rank);
  for (int d = 0; d < rank; ++d) l.strides[2][perm[d]] = pstrides[d];
  return l;
}

void check_layout(const Layout& l, int64_t grain) {
  const int64_t total = numel(l.shape);
  // Indexed by output offset: which offsets each operand was visited at, and how often.
  auto hits = std::make_unique<std::atomic<int>[]>(std::max<int64_t>(total, 1));
  std::vector<int64_t> got1(total, -1), got2(total, -1);
  for (int64_t i = 0; i < total; ++i) hits[i] = 0;
  std::atomic<bool> out_of_range{false};
  cpu::for_each_row<3>(l.shape, l.strides, grain, [&](const cpu::Row<3>& r) {
    for (int64_t j = 0; j < r.len; ++j) {
      const int64_t o = r.offsets[0] + j * r.inner[0];
      if (o < 0 || o >= total) {
        out_of_range = true;
        return;
      }
      hits[o].fetch_add(1);
      got1[o] = r.offsets[1] + j * r.inner[1];
      got2[o] = r.offsets[2] + j * r.inner[2];
    }
  });
  ASSERT_FALSE(out_of_range);
  for (int64_t i = 0; i < total; ++i) {
    ASSERT_EQ(hits[i].load(), 1) << "output element " << i;
    ASSERT_EQ(got1[i], naive_offset(i, l.shape, l.strides[1])) << "broadcast operand, element " << i;
    ASSERT_EQ(got2[i], naive_offset(i, l.shape, l.strides[2])) << "permuted operand, element " << i;
  }
}

TEST(Strided, ForEachRowMatchesNaiveWalk) {
  const int64_t saved = num_threads();
  set_num_threads(3);
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 400; ++trial) {
    const Layout l = random_layout(rng);
    for (int64_t grain : {1, 5, 64, 1 << 15}) {
      SCOPED_TRACE(::testing::Message() << "trial " << trial << " grain " << grain << " shape "
                                        << ::testing::PrintToString(l.shape) << " strides "
                                        << ::testing::PrintToString(l.strides[1]) << " / "
                                        << ::testing::PrintToString(l.strides[2]));
      check_layout(l, grain);
      if (::testing::Test::HasFatalFailure()) break;
    }
    if (::testing::Test::HasFatalFailure()) break;
  }
  set_num_threads(saved);
}

// Transposed operands big enough for several blocks of kTileRows rows and several kTileCols-wide
// column chunks, partial ones at both ends (walk_in_tiles), with a broadcast row beside them.
TEST(Strided, TransposedOperandsWalkInTiles) {
  const int64_t saved = num_threads();
  set_num_threads(3);
  for (const Dims& shape : {Dims{37, 70}, Dims{3, 33, 65}, Dims{16, 32}, Dims{2, 17, 5}}) {
    const int64_t rank = static_cast<int64_t>(shape.size());
    Layout l;
    l.shape = shape;
    l.strides[0] = contiguous_strides(shape);
    Dims row_shape(rank, 1);
    row_shape.back() = shape.back();
    l.strides[1] = broadcast_strides(view(nullptr, DType::float32, row_shape), shape);
    // The last two dimensions swapped in memory: x.mT.
    Dims swapped = shape;
    std::swap(swapped[rank - 1], swapped[rank - 2]);
    l.strides[2] = contiguous_strides(swapped);
    std::swap(l.strides[2][rank - 1], l.strides[2][rank - 2]);
    for (int64_t grain : {1, 64, 1 << 15}) {
      SCOPED_TRACE(::testing::Message() << "shape " << ::testing::PrintToString(shape) << " grain " << grain);
      check_layout(l, grain);
      if (::testing::Test::HasFatalFailure()) break;
    }
    // Tiled: no row runs longer than kTileCols (row by row, each would be the whole last dimension).
    int64_t longest = 0;
    cpu::for_each_row<3>(l.shape, l.strides, 1 << 15,
                         [&](const cpu::Row<3>& r) { longest = std::max(longest, r.len); });
    EXPECT_EQ(longest, std::min(cpu::kTileCols, shape.back()));
  }
  set_num_threads(saved);
}

TEST(Strided, CoalescesContiguousIntoOneRow) {
  // Contiguous operands and a scalar broadcast collapse to a single row: the SIMD fast path.
  Dims shape{4, 5, 6};
  const auto c = contiguous_strides(shape);
  std::vector<cpu::Row<2>> rows;
  cpu::for_each_row<2>(shape, {c, Dims{0, 0, 0}}, int64_t{1} << 20,
                       [&](const cpu::Row<2>& r) { rows.push_back(r); });
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].len, 120);
  EXPECT_EQ(rows[0].inner[0], 1);
  EXPECT_EQ(rows[0].inner[1], 0);
}

TEST(Strided, ZeroSizeAndScalarShapes) {
  int calls = 0;
  cpu::for_each_row<2>({3, 0, 2}, {Dims{0, 2, 1}, Dims{5, 1, 9}}, 1,
                       [&](const cpu::Row<2>&) { ++calls; });
  EXPECT_EQ(calls, 0);  // nothing to visit
  std::vector<cpu::Row<2>> rows;
  cpu::for_each_row<2>({}, {Dims{}, Dims{}}, 1,
                       [&](const cpu::Row<2>& r) { rows.push_back(r); });
  ASSERT_EQ(rows.size(), 1u);  // a 0-d tensor is one element
  EXPECT_EQ(rows[0].len, 1);
  EXPECT_EQ(rows[0].offsets[0], 0);
  EXPECT_EQ(rows[0].offsets[1], 0);
}

}  // namespace
}  // namespace opforge
