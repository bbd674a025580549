// The CUDA kernels' strided indexer (include/opforge/cuda/common.cuh), on the host: the merged
// indexer make_indexer builds must give, for every linear index, the offset a naive unravel over
// the original shape gives. Shapes are random with size-1, broadcast (stride 0), sliced and
// permuted dimensions, up to rank 12. Compiled only when CUDA is; runs without a GPU.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "opforge/cuda/common.cuh"
#include "test_util.h"

namespace opforge {
namespace {

using testing::naive_offset;
using testing::random_strides;

TEST(CudaIndexer, MergedOffsetsEqualTheNaiveOnes) {
  std::mt19937 rng(1234);
  int checked = 0, refused = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const size_t rank = rng() % 13;
    Dims shape(rank);
    for (auto& s : shape) s = rng() % 3 == 0 ? 1 : 1 + rng() % 4;
    const Dims strides = random_strides(shape, rng);
    const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
    cuda::Indexer ix;
    try {
      ix = cuda::make_indexer("test", shape, strides);
    } catch (const Error& e) {
      EXPECT_GT(rank, static_cast<size_t>(cuda::kMaxRank));
      EXPECT_NE(std::string(e.what()).find("merge to at most 8 dimensions"), std::string::npos) << e.what();
      ++refused;
      continue;
    }
    EXPECT_LE(ix.rank, cuda::kMaxRank);
    EXPECT_TRUE(ix.narrow);
    cuda::Indexer wide = ix;  // the 64-bit unravel, which shapes of 2^31 elements or more take
    wide.narrow = false;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(ix.offset(i), naive_offset(i, shape, strides)) << "trial " << trial;
      ASSERT_EQ(wide.offset(i), naive_offset(i, shape, strides)) << "trial " << trial;
    }
    ++checked;
  }
  EXPECT_GT(checked, 2000);
  EXPECT_GT(refused, 0);  // some views of rank > 8 do not merge
}

TEST(CudaIndexer, ContiguousTensorsOfAnyRankMergeToOneDimension) {
  const Dims shape{2, 1, 3, 2, 2, 1, 2, 3, 2, 2, 1, 2};
  Dims strides(shape.size());
  int64_t step = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = step;
    step *= shape[d];
  }
  const cuda::Indexer ix = cuda::make_indexer("test", shape, strides);
  EXPECT_EQ(ix.rank, 1);
  for (int64_t i = 0; i < step; ++i) ASSERT_EQ(ix.offset(i), i);
}

TEST(CudaIndexer, LargeShapesUnravelIn64Bits) {
  // [3, 2^30] broadcast along the rows: 3 * 2^30 elements, past 32-bit indices.
  const Dims shape{3, int64_t{1} << 30}, strides{0, 1};
  const cuda::Indexer ix = cuda::make_indexer("test", shape, strides);
  EXPECT_FALSE(ix.narrow);
  for (int64_t i : {int64_t{0}, (int64_t{1} << 30) - 1, int64_t{1} << 30, (int64_t{3} << 30) - 1, int64_t{5} << 29})
    EXPECT_EQ(ix.offset(i), naive_offset(i, shape, strides)) << i;
  EXPECT_TRUE(cuda::make_indexer("test", {2, (int64_t{1} << 30) - 1}, {0, 1}).narrow);  // 2^31 - 2 elements
  EXPECT_FALSE(cuda::make_indexer("test", {2, int64_t{1} << 30}, {0, 1}).narrow);        // 2^31
}

}  // namespace
}  // namespace opforge
