// scatter_add's summing kernel (ops/scatter_add/scatter_add.cuh) under every schedule
// bench/schedules_cuda.cu times: each output must be its bucket's source values added one after
// another in position order, the CPU kernel's bits, whatever the loads ahead, block size and
// columns per thread. Layouts: blocks within one bucket (positions staged in shared memory, more
// than one chunk of them) and across buckets (each thread's own walk), outer dimensions, empty
// buckets, slices whose length or alignment rules vectors out, no source rows; grids capped at 3
// blocks (several trips of the grid-stride loop) and not. Compiled like the ops' CUDA sources:
// rewritten, then with the emulator's header ahead.
#include <gtest/gtest.h>

#include <cstring>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "ops/scatter_add/scatter_add.cuh"

namespace {

using namespace opforge;
namespace sa = scatter_add_cuda;

// 64-byte aligned storage: every vector of every schedule aligned to its size (cudaMalloc's are).
template <typename T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U> Aligned64(const Aligned64<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{64}); }
  template <class U> bool operator==(const Aligned64<U>&) const { return true; }
};
template <typename T>
using AlignedVector = std::vector<T, Aligned64<T>>;

// src is [outer, rows, n], its rows (dim 1) summed into [outer, buckets, n].
struct Case {
  int64_t outer, rows, n, buckets;
};

template <typename T>
struct Data {
  AlignedVector<T> src;
  Dims order, start;  // the sort's results: positions by bucket, each bucket's first
};

template <typename T>
Data<T> random_data(const Case& c, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  Data<T> d;
  d.src.resize(c.outer * c.rows * c.n);
  for (T& v : d.src) v = static_cast<T>(u(gen));
  Dims index(c.rows);
  // Bucket 1 stays empty where there are three or more.
  for (int64_t& v : index) v = c.buckets > 2 ? (gen() % (c.buckets - 1) + 2) % c.buckets : gen() % c.buckets;
  for (int64_t b = 0; b < c.buckets; ++b) {
    d.start.push_back(static_cast<int64_t>(d.order.size()));
    for (int64_t r = 0; r < c.rows; ++r)
      if (index[r] == b) d.order.push_back(r);
  }
  d.start.push_back(c.rows);
  return d;
}

scatter_cuda::SliceIndexers slices(const Case& c) {
  scatter_cuda::SliceIndexers s;
  if (c.outer > 1) {
    s.outer.rank = 1;
    s.outer.shape[0] = c.outer;
    s.outer.strides[0] = c.rows * c.n;
  }
  s.inner.rank = 1;
  s.inner.shape[0] = c.n;
  s.inner.strides[0] = 1;
  s.outer_size = c.outer;
  s.inner_size = c.n;
  s.step = c.n;
  return s;
}

// The CPU kernel's sums: each output's bucket in position order, in the accumulation type.
template <typename T>
std::vector<T> reference(const Case& c, const Data<T>& d) {
  std::vector<T> out(c.outer * c.buckets * c.n);
  for (int64_t o = 0; o < c.outer; ++o)
    for (int64_t b = 0; b < c.buckets; ++b)
      for (int64_t k = 0; k < c.n; ++k) {
        cuda::Acc<T> acc = 0;
        for (int64_t p = d.start[b]; p < d.start[b + 1]; ++p)
          acc += static_cast<cuda::Acc<T>>(d.src[(o * c.rows + d.order[p]) * c.n + k]);
        out[(o * c.buckets + b) * c.n + k] = static_cast<T>(acc);
      }
  return out;
}

// Runs sum_kernel<T, S> where its columns fit (returns whether they did) and expects the
// reference's bits.
template <typename T, class S>
bool expect_schedule_sums_in_order(const Case& c, const Data<T>& d, const std::vector<T>& want, int64_t cap) {
  const scatter_cuda::SliceIndexers s = slices(c);
  AlignedVector<T> out(want.size());
  if (!sa::columns_fit(S::kColumns, s, d.src.data(), out.data(), sizeof(T))) return false;
  const int64_t total = c.outer * c.buckets * c.n;
  const int64_t saved = cuda_emu::set_grid_cap(cap);
  sa::launch_sum<T, S>(out.data(), d.src.data(), s, d.start.data(), d.order.data(), c.buckets, total, nullptr);
  cuda_emu::set_grid_cap(saved);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const std::string label = std::to_string(S::kAhead) + " ahead, " + std::to_string(S::kThreads) + " threads, " +
                            std::to_string(S::kColumns) + " columns";
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&out[i], &want[i], sizeof(T)) == 0) continue;
    ADD_FAILURE() << label << ": output " << i << " of " << c.outer << " x " << c.buckets << " x " << c.n << " from "
        << c.rows << " rows, grid cap " << cap << ": " << static_cast<float>(out[i]) << ", want "
        << static_cast<float>(want[i]);
    break;
  }
  return true;
}

// Every schedule of the bench; returns how many ran (their columns fit).
template <typename T>
int expect_every_schedule_sums_in_order(const Case& c) {
  using sa::SumSchedule;
  const Data<T> d = random_data<T>(c, static_cast<unsigned>(c.rows * 7 + c.n));
  const std::vector<T> want = reference(c, d);
  int ran = 0;
  for (int64_t cap : {int64_t{1} << 20, int64_t{3}}) {
    ran = 0;
    ran += expect_schedule_sums_in_order<T, sa::OwnSum<T>>(c, d, want, cap);
    ran += expect_schedule_sums_in_order<T, SumSchedule<16, 256, 1>>(c, d, want, cap);
    ran += expect_schedule_sums_in_order<T, SumSchedule<64, 256, 1>>(c, d, want, cap);
    ran += expect_schedule_sums_in_order<T, SumSchedule<32, 128, 1>>(c, d, want, cap);
    ran += expect_schedule_sums_in_order<T, SumSchedule<16, 128, 2>>(c, d, want, cap);
    ran += expect_schedule_sums_in_order<T, SumSchedule<32, 128, 2>>(c, d, want, cap);
    ran += expect_schedule_sums_in_order<T, SumSchedule<8, 128, 4>>(c, d, want, cap);
    ran += expect_schedule_sums_in_order<T, SumSchedule<16, 128, 4>>(c, d, want, cap);
    ran += expect_schedule_sums_in_order<T, SumSchedule<16, 64, 4>>(c, d, want, cap);
  }
  return ran;
}

TEST(ScatterSchedules, EveryScheduleSumsEachBucketInOrder) {
  // Two buckets of ~550 rows: two chunks of staged positions; 300-element slices: blocks within
  // one bucket and blocks across two.
  EXPECT_EQ(expect_every_schedule_sums_in_order<float>({1, 1100, 300, 2}), 9);
  // Outer dimensions, slices shorter than a block (every block across buckets), an empty bucket.
  EXPECT_EQ(expect_every_schedule_sums_in_order<float>({3, 40, 64, 5}), 9);
  EXPECT_EQ(expect_every_schedule_sums_in_order<__nv_bfloat16>({2, 300, 512, 3}), 9);
  EXPECT_EQ(expect_every_schedule_sums_in_order<double>({1, 70, 260, 4}), 9);
  // No source rows: every output 0.
  EXPECT_EQ(expect_every_schedule_sums_in_order<float>({2, 0, 64, 3}), 9);
  // Slices of an odd length: one column per thread only.
  EXPECT_EQ(expect_every_schedule_sums_in_order<float>({1, 37, 301, 4}), 4);
  // Even, not a multiple of 4: up to 2.
  EXPECT_EQ(expect_every_schedule_sums_in_order<float>({2, 21, 66, 3}), 6);
}

// Where the vectors would straddle slices or sit misaligned, columns_fit says no.
TEST(ScatterSchedules, ColumnsFitOnlyAlignedContiguousSlices) {
  alignas(16) static float buffer[64];
  scatter_cuda::SliceIndexers s = slices({2, 4, 8, 3});
  EXPECT_TRUE(sa::columns_fit(4, s, buffer, buffer, 4));
  EXPECT_FALSE(sa::columns_fit(4, s, buffer + 1, buffer, 4));  // src 4 bytes in
  EXPECT_FALSE(sa::columns_fit(4, s, buffer, buffer + 2, 4));  // out 8 bytes in
  EXPECT_TRUE(sa::columns_fit(2, s, buffer, buffer + 2, 4));
  s.outer.strides[0] = 30;  // an outer stride that is no whole number of vectors
  EXPECT_FALSE(sa::columns_fit(4, s, buffer, buffer, 4));
  EXPECT_TRUE(sa::columns_fit(2, s, buffer, buffer, 4));
  s = slices({1, 4, 8, 3});
  s.inner.strides[0] = 2;  // strided slices
  EXPECT_FALSE(sa::columns_fit(2, s, buffer, buffer, 4));
  EXPECT_TRUE(sa::columns_fit(1, s, buffer, buffer, 4));
  s = slices({1, 4, 8, 3});
  s.step = 10;  // rows 10 elements apart
  EXPECT_FALSE(sa::columns_fit(4, s, buffer, buffer, 4));
  EXPECT_TRUE(sa::columns_fit(2, s, buffer, buffer, 4));
}

}  // namespace
