// The kernels under the schedules bench/schedules_cuda.cu times beside the ops' own: the norms'
// contiguous-row kernels over other row types (CachedRow with other packs per thread, ordered or
// streaming stores; StagedRow; RereadRow) and map_contiguous (packs per thread, tiles, block size,
// streaming). Each must compute the op, checked here against a double-precision reference, and
// the row types bit for bit against CachedRow at the same packs per thread (map_contiguous against
// its own schedule), so a schedule the GPU run finds faster can become the ops' own. The PTX of
// OrderedAccess's store and of RereadRow's hinted loads is the GPU's only (plain accesses here);
// bench/schedules_cuda.cu compares every schedule's output with the ops' own on the GPU. Compiled
// like the ops' CUDA sources: rewritten, then with the emulator's header ahead.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "opforge/cuda/activation.cuh"
#include "opforge/cuda/schedule_variants.cuh"
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

// op's contiguous_kernel over rows of type Row on d (rounded to Row's element type): its output,
// checked against the double reference within the type's precision.
template <class Row>
std::vector<float> expect_schedule_computes(const std::string& op, Data d, const char* schedule) {
  using T = typename Row::Element;
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
  const int threads = cuda::contiguous_row_threads<Row>(d.n);
  EXPECT_GT(threads, 0) << schedule;
  if (threads == 0) return {};
  const double eps = 1e-5;
  if (op == "rms_norm")
    rms_norm_cuda::contiguous_kernel<T, Row><<<cuda::row_blocks(d.rows), threads, 0, nullptr>>>(out, x, w, 1, d.rows,
                                                                                                d.n, eps);
  else
    layer_norm_cuda::contiguous_kernel<T, Row><<<cuda::row_blocks(d.rows), threads, 0, nullptr>>>(
        out, x, w, 1, b, 1, d.rows, d.n, eps);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<double> want = reference(op, d, eps);
  const double tolerance = sizeof(T) == 4 ? 2e-5 : 2e-2;  // relative to the result's magnitude, or 1
  std::vector<float> got(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    got[i] = static_cast<float>(out[i]);
    EXPECT_NEAR(got[i], want[i], tolerance * std::max(1.0, std::fabs(want[i])))
        << op << " " << schedule << " " << threads << " threads, element " << i << " of rows " << d.rows << " x "
        << d.n;
    if (::testing::Test::HasFailure()) break;
  }
  return got;
}

// Row computes op, and with the bits of CachedRow at its packs per thread: the same sums in the
// same order, whatever holds the row between passes.
template <class Row>
void expect_same_bits_as_cached(const std::string& op, const Data& d, const char* schedule) {
  using T = typename Row::Element;
  const std::vector<float> got = expect_schedule_computes<Row>(op, d, schedule);
  const std::vector<float> cached = expect_schedule_computes<cuda::CachedRow<T, Row::kThreadPacks>>(op, d, "cached");
  ASSERT_EQ(got.size(), cached.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], cached[i]) << op << " " << schedule << ", element " << i << " of rows " << d.rows << " x " << d.n;
}

template <typename T>
void expect_every_schedule_computes(int64_t rows, int64_t n) {
  using cuda::CachedRow, cuda::OrderedAccess, cuda::PlainAccess, cuda::RereadRow, cuda::StagedRow,
      cuda::StreamingAccess;
  for (const char* op : {"rms_norm", "layer_norm"}) {
    const Data d = random_data(rows, n, static_cast<unsigned>(rows * 131 + n));
    expect_schedule_computes<rms_norm_cuda::OwnRow<T>>(op, d, "the ops' own");
    expect_schedule_computes<CachedRow<T, 2>>(op, d, "2 packs");
    expect_schedule_computes<CachedRow<T, 8>>(op, d, "8 packs");
    expect_schedule_computes<CachedRow<T, 16>>(op, d, "16 packs");
    expect_same_bits_as_cached<CachedRow<T, cuda::kRowPacks, OrderedAccess>>(op, d, "ordered stores");
    expect_same_bits_as_cached<CachedRow<T, 8, OrderedAccess>>(op, d, "8 packs ordered stores");
    expect_same_bits_as_cached<CachedRow<T, cuda::kRowPacks, StreamingAccess>>(op, d, "streaming");
    expect_same_bits_as_cached<CachedRow<T, 8, StreamingAccess>>(op, d, "8 packs streaming");
    expect_same_bits_as_cached<StagedRow<T, 4>>(op, d, "staged, 4 packs");
    expect_same_bits_as_cached<StagedRow<T, 8>>(op, d, "staged, 8 packs");
    expect_same_bits_as_cached<RereadRow<T, 4, 2>>(op, d, "reread, 4 packs, 2 at a time");
    expect_same_bits_as_cached<RereadRow<T, 4, 2, false>>(op, d, "reread, 4 packs, 2 at a time, no hints");
    expect_same_bits_as_cached<RereadRow<T, 4, 1>>(op, d, "reread, 4 packs, 1 at a time");
    expect_same_bits_as_cached<RereadRow<T, 2, 1>>(op, d, "reread, 2 packs, 1 at a time");
    expect_same_bits_as_cached<RereadRow<T, 8, 2>>(op, d, "reread, 8 packs, 2 at a time");
    expect_same_bits_as_cached<RereadRow<T, 16, 4>>(op, d, "reread, 16 packs, 4 at a time");
  }
}

// A row longer than a StagedRow holds has no threads (the op would take its other kernel).
TEST(RowSchedules, RowTypesSayWhichRowsTheyHold) {
  constexpr int64_t staged_floats = cuda::kStagedPacks * 4;
  EXPECT_GT((cuda::contiguous_row_threads<cuda::StagedRow<float, 8>>(staged_floats)), 0);
  EXPECT_EQ((cuda::contiguous_row_threads<cuda::StagedRow<float, 8>>(staged_floats + 4)), 0);
  EXPECT_EQ((cuda::contiguous_row_threads<cuda::CachedRow<float, 8>>(staged_floats + 4)), 128 + 32);
  EXPECT_EQ((cuda::contiguous_row_threads<cuda::RereadRow<float, 16, 4>>(4096)), 64);
  EXPECT_EQ((cuda::contiguous_row_threads<cuda::RereadRow<__nv_bfloat16, 4, 2>>(4096)), 128);
  EXPECT_EQ((cuda::contiguous_row_threads<cuda::CachedRow<float, 4>>(int64_t{4} * 4 * cuda::kMaxRowThreads + 4)), 0);
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

struct TimesPlusX {
  template <typename A> __device__ A operator()(A x, A y) const { return x * y + x; }
};

// out = silu(x) and out = x * y + x over n elements under schedule S, with the grid capped at
// `cap` blocks (several trips of the grid-stride loop); returns silu's and the product's outputs.
template <class S>
std::pair<std::vector<float>, std::vector<float>> map_outputs(const std::vector<float>& x, const std::vector<float>& y,
                                                              int64_t cap) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<cuda::Pack<float>> xm(n / 4 + 1), ym(xm.size()), om(xm.size());
  std::copy(x.begin(), x.end(), reinterpret_cast<float*>(xm.data()));
  std::copy(y.begin(), y.end(), reinterpret_cast<float*>(ym.data()));
  float* out = reinterpret_cast<float*>(om.data());
  const float* xp = reinterpret_cast<const float*>(xm.data());
  const float* yp = reinterpret_cast<const float*>(ym.data());
  const int64_t saved = cuda_emu::set_grid_cap(cap);
  cuda::launch_map_contiguous<float, 1, cuda::Silu, S>(out, cuda::Operands<float, 1>{{xp}}, n, cuda::Silu{}, nullptr);
  std::vector<float> silu(out, out + n);
  cuda::launch_map_contiguous<float, 2, TimesPlusX, S>(out, cuda::Operands<float, 2>{{xp, yp}}, n, TimesPlusX{},
                                                       nullptr);
  cuda_emu::set_grid_cap(saved);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  return {silu, std::vector<float>(out, out + n)};
}

template <class S>
void expect_map_schedule_computes(const char* schedule) {
  using Own = cuda::MapSchedule<>;
  // Whole packs, a tail of 1-3 elements, fewer elements than one pack, a partial last tile.
  for (int64_t n : {4096, 4099, 3, 1000, 5 * 256 * 4 + 4 * 37}) {
    for (int64_t cap : {int64_t{1} << 20, int64_t{3}}) {
      std::mt19937 gen(static_cast<unsigned>(n + cap));
      std::uniform_real_distribution<float> u(-6.0f, 6.0f);
      std::vector<float> x(n), y(n);
      for (float& v : x) v = u(gen);
      for (float& v : y) v = u(gen);
      const auto [silu, product] = map_outputs<S>(x, y, cap);
      const auto [own_silu, own_product] = map_outputs<Own>(x, y, cap);
      for (int64_t i = 0; i < n; ++i) {
        const double want = x[i] / (1.0 + std::exp(-double(x[i])));
        ASSERT_NEAR(silu[i], want, 1e-5 * std::max(1.0, std::fabs(want)))
            << schedule << ": silu, element " << i << " of " << n << ", grid cap " << cap;
        ASSERT_EQ(silu[i], own_silu[i]) << schedule << ": silu, element " << i << " of " << n;
        ASSERT_EQ(product[i], x[i] * y[i] + x[i]) << schedule << ": x * y + x, element " << i << " of " << n;
        ASSERT_EQ(product[i], own_product[i]) << schedule << ": x * y + x, element " << i << " of " << n;
      }
    }
  }
}

TEST(MapSchedules, EveryScheduleComputesTheElementwiseOps) {
  using cuda::MapSchedule, cuda::PlainAccess, cuda::StreamingAccess;
  expect_map_schedule_computes<MapSchedule<>>("the ops' own");
  expect_map_schedule_computes<MapSchedule<2>>("2 packs");
  expect_map_schedule_computes<MapSchedule<8>>("8 packs");
  expect_map_schedule_computes<MapSchedule<4, true>>("4 packs tiled");
  expect_map_schedule_computes<MapSchedule<2, true, PlainAccess, 128>>("2 packs tiled, 128 threads");
  expect_map_schedule_computes<MapSchedule<4, false, PlainAccess, 128>>("4 packs, 128 threads");
  expect_map_schedule_computes<MapSchedule<4, false, StreamingAccess>>("4 packs streaming");
  expect_map_schedule_computes<MapSchedule<4, true, StreamingAccess>>("4 packs tiled streaming");
}

}  // namespace

int schedules_cuda_main(int argc, char** argv);  // bench/schedules_cuda.cu

namespace {

// bench/schedules_cuda.cu's own code, a GPU program, run here at a toy size (the emulator's times
// mean nothing): every schedule runs, its output agrees with its op's own (else it exits 1; one
// token's matmul_q in one launch and in two, summed either way: bit for bit), and each gets its table row and CSV
// line, the ops' own first.
TEST(Schedules, TheBenchmarkRunsEverySchedule) {
  std::string csv = ::testing::TempDir() + "schedules_cuda.csv";
  std::string prog = "schedules_cuda", rows = "6", cols = "512", repeats = "2";
  char* argv[] = {prog.data(), csv.data(), rows.data(), cols.data(), repeats.data()};
  const size_t events_before = cuda_emu::live_events(), allocations_before = cuda_emu::live_allocations();
  const bool allowed = cuda_emu::allow_cuda_malloc(true);  // a standalone program's allocations
  const int64_t cap = cuda_emu::set_grid_cap(3);  // every kernel's grid-stride loop takes several trips
  int rc = -1;
  ::testing::internal::CaptureStdout();
  try {
    rc = schedules_cuda_main(5, argv);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "schedules_cuda: " << e.what();
  }
  const std::string table = ::testing::internal::GetCapturedStdout();
  cuda_emu::allow_cuda_malloc(allowed);
  cuda_emu::set_grid_cap(cap);
  cuda_emu::take_stream_uses();
  cuda_emu::take_launches();
  ASSERT_EQ(rc, 0) << table;
  EXPECT_EQ(cuda_emu::live_events(), events_before) << "the program left events behind";
  EXPECT_EQ(cuda_emu::live_allocations(), allocations_before) << "the program left device memory behind";
  std::ifstream in(csv);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_GT(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("device,op,dtype,schedule,", 0), 0u) << lines[0];
  std::map<std::string, int> per_op_dtype;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    EXPECT_EQ(l.rfind("CUDA emulator,", 0), 0u) << l;
    const size_t op_end = l.find(',', 14), dtype_end = l.find(',', op_end + 1);
    ++per_op_dtype[l.substr(14, dtype_end - 14)];
  }
  // rms_norm and layer_norm: the op's own and 2/4/8/16 plain, 4/8 ordered, 4/8 streaming, 4/2
  // columns first, the op's own capped at 32 registers, 4/8 staged, 9 reread; silu and copy: the
  // ops' own and 8 others; in both dtypes.
  for (const char* dtype : {"float32", "bfloat16"}) {
    for (const char* op : {"rms_norm", "layer_norm"}) EXPECT_EQ((per_op_dtype[std::string(op) + "," + dtype]), 23) << op;
    for (const char* op : {"silu", "copy"}) EXPECT_EQ((per_op_dtype[std::string(op) + "," + dtype]), 9) << op;
  }
  // scatter_add's sum: the op's own two (two columns where they fit, first; one elsewhere) and 7
  // others, each once, in both dtypes.
  for (const char* dtype : {"float32", "bfloat16"}) {
    EXPECT_EQ((per_op_dtype[std::string("scatter_add 6x512 into 16,") + dtype]), 9) << dtype;
    EXPECT_NE(table.find(std::string("| scatter_add 6x512 into 16 | ") + dtype +
                         " | 32 rows ahead, 128 threads, 2 columns (the op's) |"),
              std::string::npos)
        << table;
  }
  EXPECT_NE(table.find("| scatter_add 6x512 into 16 | bfloat16 | 16 rows ahead, 256 threads, 1 column (the op's where "
                       "2 columns do not fit) |"),
            std::string::npos)
      << table;
  // matmul_q for one token, one launch (the op's) and two, each with the shuffled sums (the op's)
  // and a lane's; for 8 rows two launches either way; in both formats.
  for (const char* format : {"q4_0", "q8_0"}) {
    EXPECT_EQ((per_op_dtype[std::string("matmul_q ") + format + " 1x512 @ 512x512^T,float32"]), 4) << format;
    EXPECT_EQ((per_op_dtype[std::string("matmul_q ") + format + " 8x512 @ 512x512^T,float32"]), 2) << format;
  }
  EXPECT_NE(table.find("| matmul_q q4_0 8x512 @ 512x512^T | float32 | two launches (the op's) |"), std::string::npos)
      << table;
  EXPECT_NE(table.find("| matmul_q q4_0 1x512 @ 512x512^T | float32 | one launch (the op's) |"), std::string::npos)
      << table;
  EXPECT_NE(table.find("| matmul_q q8_0 1x512 @ 512x512^T | float32 | two launches, a lane's sums |"), std::string::npos)
      << table;
  EXPECT_NE(table.find("| rms_norm | float32 | 4 packs plain (the op's) |"), std::string::npos) << table;
  EXPECT_NE(table.find("| silu | bfloat16 | 4 packs a grid apart, 256 threads, plain (the ops') |"), std::string::npos)
      << table;
}

}  // namespace
