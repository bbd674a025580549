// The plan of the CUDA sums over broadcast dimensions (include/opforge/cuda/sum_to_shape.cuh), on
// the host: split_for_sum must pair every grad element with the output it belongs to, exactly
// once, through the kept and summed indexers the kernels walk; the chunked sum's chunks must
// cover every term once, each long enough, with a bounded thread count. Compiled only when
// CUDA is; runs without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "opforge/cuda/sum_to_shape.cuh"
#include "test_util.h"

namespace opforge {
namespace {

using testing::naive_offset;
using testing::random_strides;

int64_t product(const Dims& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{1}, std::multiplies<>());
}

TEST(CudaSumPlan, EveryGradElementGoesToItsOutputOnce) {
  std::mt19937 rng(99);
  int checked = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t rank = rng() % 7;
    Dims grad_shape(rank);
    for (auto& s : grad_shape) s = rng() % 4 == 0 ? 1 : 1 + rng() % 4;
    // out: a suffix of grad's shape (fewer leading dims) with some dimensions broadcast (1).
    const size_t out_rank = rank - (rank ? rng() % (rank + 1) : 0);
    Dims out_shape(grad_shape.end() - static_cast<ptrdiff_t>(out_rank), grad_shape.end());
    for (auto& s : out_shape)
      if (rng() % 3 == 0) s = 1;
    const Dims strides = random_strides(grad_shape, rng);
    const cuda::SumSplit split = cuda::split_for_sum(grad_shape, out_shape, {strides});
    const int64_t m = product(out_shape), r = product(grad_shape) / std::max<int64_t>(m, 1);
    ASSERT_EQ(product(split.kept), m);
    ASSERT_EQ(product(split.summed) * m, product(grad_shape));
    const cuda::Indexer kept = cuda::make_indexer("test", split.kept, split.kept_steps[0]);
    const cuda::Indexer summed = cuda::make_indexer("test", split.summed, split.summed_steps[0]);
    // (output, grad offset) of every term, as the kernels walk them and as the shapes say.
    std::vector<std::pair<int64_t, int64_t>> walked, wanted;
    for (int64_t o = 0; o < m; ++o)
      for (int64_t i = 0; i < r; ++i) walked.emplace_back(o, kept.offset(o) + summed.offset(i));
    for (int64_t g = 0; g < product(grad_shape); ++g) {
      int64_t rest = g, o = 0, place = 1;
      for (size_t d = rank; d-- > 0;) {
        const int64_t coord = rest % grad_shape[d];
        rest /= grad_shape[d];
        const size_t od = d - (rank - out_rank);
        if (d >= rank - out_rank && out_shape[od] != 1) {
          o += coord * place;
          place *= out_shape[od];
        }
      }
      wanted.emplace_back(o, naive_offset(g, grad_shape, strides));
    }
    std::sort(walked.begin(), walked.end());
    std::sort(wanted.begin(), wanted.end());
    ASSERT_EQ(walked, wanted) << "trial " << trial;
    // inner_kept: grad's innermost dimension of size > 1 is one the output keeps.
    int64_t inner = -1;
    for (size_t d = 0; d < rank; ++d)
      if (grad_shape[d] != 1) inner = static_cast<int64_t>(d);
    const bool inner_kept = inner < 0 || (static_cast<size_t>(inner) >= rank - out_rank &&
                                          out_shape[inner - (rank - out_rank)] == grad_shape[inner]);
    EXPECT_EQ(split.inner_kept, inner_kept) << "trial " << trial;
    ++checked;
  }
  EXPECT_EQ(checked, 2000);
}

TEST(CudaSumPlan, ChunksCoverEveryTermOnceAndFillTheGpu) {
  const std::vector<std::pair<int64_t, int64_t>> cases{
      {4096, 16384}, {1, 1 << 24}, {64, 1000000}, {1 << 20, 300}, {3, 256}, {7, 257}, {100000, 100000}, {5, 64}};
  for (const auto& [m, r] : cases) {
    const int64_t chunks = cuda::sum_chunk_count(m, r);
    ASSERT_GE(chunks, 1);
    const int64_t chunk = (r + chunks - 1) / chunks;
    if (chunks > 1) {
      EXPECT_GE(chunk, cuda::kSumMinChunk) << m << " x " << r;
      EXPECT_LE(m * chunks, std::max(m, cuda::kSumTargetThreads)) << m << " x " << r;
    }
    std::vector<int> covered(r, 0);
    for (int64_t c = 0; c < chunks; ++c)
      for (int64_t i = c * chunk; i < std::min(r, (c + 1) * chunk); ++i) ++covered[i];
    EXPECT_TRUE(std::all_of(covered.begin(), covered.end(), [](int n) { return n == 1; })) << m << " x " << r;
  }
  // A bias gradient [16384, 4096] -> [4096] runs on 2^17 threads, not 4096.
  EXPECT_EQ(4096 * cuda::sum_chunk_count(4096, 16384), cuda::kSumTargetThreads);
}

}  // namespace
}  // namespace opforge
