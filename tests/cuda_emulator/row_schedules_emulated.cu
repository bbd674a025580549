// The norms' cached-row kernels under the schedules bench/row_schedules.cu times beside the ops'
// own (other packs per thread, ordered or streaming stores): each must compute the op, checked
// here against a double-precision reference, so a schedule the GPU run finds faster can become
// the ops' own. (The PTX of OrderedAccess's store is the GPU's: here it is a plain store, and
// bench/row_schedules.cu compares every schedule's output with the ops' own on the GPU.) Compiled like the ops' CUDA sources: rewritten, then with the emulator's header ahead.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ops/layer_norm/layer_norm.cuh"
#include "ops/rms_norm/rms_norm.cuh"

namespace {

using namespace opforge;

struct Data {
  int64_t rows, n;
  std::vector<float> x, w, b;
};

Data random_data(int64_t rows, int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  Data d{rows, n, std::vector<float>(rows * n), std::vector<float>(n), std::vector<float>(n)};
  for (float& v : d.x) v = u(gen) + 0.5f;  // a mean away from 0, for layer_norm
  for (float& v : d.w) v = u(gen);
  for (float& v : d.b) v = u(gen);
  return d;
}

// The op in double, from the values as T holds them.
std::vector<double> reference(const std::string& op, const Data& d, double eps) {
  std::vector<double> y(d.x.size());
  for (int64_t r = 0; r < d.rows; ++r) {
    const float* x = d.x.data() + r * d.n;
    double mean = 0, sq = 0;
    for (int64_t i = 0; i < d.n; ++i) mean += x[i];
    mean /= d.n;
    for (int64_t i = 0; i < d.n; ++i) sq += op == "rms_norm" ? double(x[i]) * x[i] : (x[i] - mean) * (x[i] - mean);
    const double scale = 1.0 / std::sqrt(sq / d.n + eps);
    for (int64_t i = 0; i < d.n; ++i)
      y[r * d.n + i] = op == "rms_norm" ? x[i] * scale * d.w[i] : (x[i] - mean) * scale * d.w[i] + d.b[i];
  }
  return y;
}

template <typename T>
std::vector<T> as(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<T>(v[i]);
  return out;
}

// Runs op's cached kernel with kPacks packs per thread and Access on d (rounded to T) and checks
// it against the double reference within T's precision.
template <typename T, int kPacks, class Access>
void expect_schedule_computes(const std::string& op, Data d, const char* schedule) {
  for (float& v : d.x) v = static_cast<float>(static_cast<T>(v));
  for (float& v : d.w) v = static_cast<float>(static_cast<T>(v));
  for (float& v : d.b) v = static_cast<float>(static_cast<T>(v));
  // 16-byte aligned, as the ops' cached rows are (cudaMalloc's are).
  std::vector<cuda::Pack<T>> x_mem(d.x.size() / cuda::Pack<T>::kSize), out_mem(x_mem.size()),
      w_mem(d.n / cuda::Pack<T>::kSize), b_mem(w_mem.size());
  T* x = reinterpret_cast<T*>(x_mem.data());
  T* out = reinterpret_cast<T*>(out_mem.data());
  T* w = reinterpret_cast<T*>(w_mem.data());
  T* b = reinterpret_cast<T*>(b_mem.data());
  const std::vector<T> xt = as<T>(d.x), wt = as<T>(d.w), bt = as<T>(d.b);
  std::copy(xt.begin(), xt.end(), x);
  std::copy(wt.begin(), wt.end(), w);
  std::copy(bt.begin(), bt.end(), b);
  const int threads = cuda::row_threads(d.n, sizeof(T), kPacks);
  ASSERT_GT(threads, 0);
  const double eps = 1e-5;
  if (op == "rms_norm")
    rms_norm_cuda::cached_kernel<T, kPacks, Access><<<cuda::row_blocks(d.rows), threads, 0, nullptr>>>(
        out, x, w, 1, d.rows, d.n, eps);
  else
    layer_norm_cuda::cached_kernel<T, kPacks, Access><<<cuda::row_blocks(d.rows), threads, 0, nullptr>>>(
        out, x, w, 1, b, 1, d.rows, d.n, eps);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<double> want = reference(op, d, eps);
  const double tolerance = sizeof(T) == 4 ? 2e-5 : 2e-2;  // relative to the result's magnitude, or 1
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(static_cast<double>(static_cast<float>(out[i])), want[i], tolerance * std::max(1.0, std::fabs(want[i])))
        << op << " " << schedule << " " << threads << " threads, element " << i << " of rows " << d.rows << " x "
        << d.n;
}

template <typename T>
void expect_every_schedule_computes(int64_t rows, int64_t n) {
  for (const char* op : {"rms_norm", "layer_norm"}) {
    const Data d = random_data(rows, n, static_cast<unsigned>(rows * 131 + n));
    expect_schedule_computes<T, cuda::kRowPacks, cuda::PlainAccess>(op, d, "the ops' own");
    expect_schedule_computes<T, 2, cuda::PlainAccess>(op, d, "2 packs");
    expect_schedule_computes<T, 8, cuda::PlainAccess>(op, d, "8 packs");
    expect_schedule_computes<T, 16, cuda::PlainAccess>(op, d, "16 packs");
    expect_schedule_computes<T, cuda::kRowPacks, cuda::OrderedAccess>(op, d, "ordered stores");
    expect_schedule_computes<T, 8, cuda::OrderedAccess>(op, d, "8 packs ordered stores");
    expect_schedule_computes<T, cuda::kRowPacks, cuda::StreamingAccess>(op, d, "streaming");
    expect_schedule_computes<T, 8, cuda::StreamingAccess>(op, d, "8 packs streaming");
  }
}

// Rows of whole warps' packs, rows that leave threads without a pack, and a row shorter than one
// warp's packs at 16 packs each (a block of 32 threads, most idle).
TEST(RowSchedules, EveryScheduleComputesTheNorms) {
  expect_every_schedule_computes<float>(5, 1024);
  expect_every_schedule_computes<float>(3, 1000);
  expect_every_schedule_computes<float>(4, 64);
  expect_every_schedule_computes<__nv_bfloat16>(3, 1024);
  expect_every_schedule_computes<__nv_bfloat16>(2, 776);
}

}  // namespace
