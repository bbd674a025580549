// Which rows the CUDA row kernels (norms, softmax) read once into registers (cuda/rows.cuh,
// cached_row_threads) and with how many threads, and which tensors the elementwise kernels take
// in 16-byte packs (common.cuh, Pack): host-side decisions, checked without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "opforge/cuda/rows.cuh"

namespace opforge {
namespace {

alignas(16) char storage[64];  // never dereferenced: only the address's alignment matters

TensorView view(Dims shape, DType dtype = DType::float32, int64_t byte_offset = 0) {
  TensorView t;
  t.data = storage + byte_offset;
  t.dtype = dtype;
  t.shape = shape;
  t.strides = contiguous_strides(shape);
  return t;
}

TEST(CudaRows, ThreadsCoverTheRowInPacksOfFourPerThread) {
  EXPECT_EQ(cuda::cached_row_threads(view({8, 4096}), view({8, 4096}), 4), 256);  // 1024 packs
  EXPECT_EQ(cuda::cached_row_threads(view({8, 1000}), view({8, 1000}), 4), 64);   // 250 packs -> 63 -> 64
  EXPECT_EQ(cuda::cached_row_threads(view({8, 64}), view({8, 64}), 4), 32);       // a warp at least
  EXPECT_EQ(cuda::cached_row_threads(view({2, 8192}), view({2, 8192}), 4), cuda::kMaxRowThreads);
  EXPECT_EQ(cuda::cached_row_threads(view({2, 4096}, DType::float16), view({2, 4096}, DType::float16), 2), 128);
  EXPECT_EQ(cuda::cached_row_threads(view({2, 4096}, DType::float64), view({2, 4096}, DType::float64), 8), 512);
}

// Other packs per thread (the schedules bench/schedules_cuda.cu times): fewer threads per row.
TEST(CudaRows, ThreadsForOtherPacksPerThread) {
  EXPECT_EQ(cuda::row_threads(4096, 4, 2), 512);
  EXPECT_EQ(cuda::row_threads(4096, 4, 8), 128);
  EXPECT_EQ(cuda::row_threads(4096, 4, 16), 64);
  EXPECT_EQ(cuda::row_threads(4096, 2, 16), 32);
  EXPECT_EQ(cuda::row_threads(1000, 4, 8), 32);   // 250 packs: the last thread holds 2
  EXPECT_EQ(cuda::row_threads(8192, 4, 2), 0);    // 1024 threads: over kMaxRowThreads
  EXPECT_EQ(cuda::row_threads(8192, 4), cuda::kMaxRowThreads);
  EXPECT_EQ(cuda::cached_row_threads(view({8, 4096}), view({8, 4096}), 4, {}, 8), 128);
  EXPECT_EQ(cuda::cached_row_threads(view({8, 4097}), view({8, 4097}), 4, {}, 8), 0);  // not whole packs
}

TEST(CudaRows, OtherRowsAreReadInPlace) {
  EXPECT_EQ(cuda::cached_row_threads(view({2, 8196}), view({2, 8196}), 4), 0);  // over kMaxRowThreads
  EXPECT_EQ(cuda::cached_row_threads(view({8, 4097}), view({8, 4097}), 4), 0);   // not whole packs
  EXPECT_EQ(cuda::cached_row_threads(view({8, 4096}, DType::float32, 4), view({8, 4096}), 4), 0);  // unaligned
  EXPECT_EQ(cuda::cached_row_threads(view({8, 4096}), view({8, 4096}, DType::float32, 8), 4), 0);
  const TensorView w = view({4096});
  EXPECT_EQ(cuda::cached_row_threads(view({8, 4096}), view({8, 4096}), 4, {&w, nullptr}), 256);  // no bias: fine
  TensorView w_strided = view({4096});
  w_strided.strides = {2};
  EXPECT_EQ(cuda::cached_row_threads(view({8, 4096}), view({8, 4096}), 4, {&w, &w_strided}), 0);
  EXPECT_EQ(cuda::cached_row_threads(view({8, 4096}), view({8, 4096}), 4, {&w, nullptr}), 256);
  const TensorView w_unaligned = view({4096}, DType::float32, 4);
  EXPECT_EQ(cuda::cached_row_threads(view({8, 4096}), view({8, 4096}), 4, {&w_unaligned}), 0);
  TensorView strided = view({8, 4096});
  strided.strides = {8192, 1};  // every other row of a larger tensor
  EXPECT_EQ(cuda::cached_row_threads(strided, view({8, 4096}), 4), 0);
}

TEST(CudaRows, PacksAreSixteenBytes) {
  EXPECT_EQ(sizeof(cuda::Pack<float>), 16u);
  EXPECT_EQ(cuda::Pack<float>::kSize, 4);
  EXPECT_EQ(cuda::Pack<__half>::kSize, 8);
  EXPECT_EQ(cuda::Pack<double>::kSize, 2);
  EXPECT_EQ(alignof(cuda::Pack<__nv_bfloat16>), 16u);
  EXPECT_TRUE(cuda::aligned16(storage));
  EXPECT_FALSE(cuda::aligned16(storage + 4));
}

}  // namespace
}  // namespace opforge
