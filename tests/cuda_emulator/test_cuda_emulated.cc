// Every op's CUDA kernels, run by the host emulator (cuda_emulator.h), against the op's CPU kernel
// on the same random inputs (op_cases.h, compared by differential.h): every dtype the CUDA kernel
// registers, contiguous, misaligned (one element in, so no 16-byte packs) and strided or broadcast
// views, empty and odd sizes, and the shapes that pick each kernel variant; each launch site must
// be reached. The inputs live in the emulated device's memory between unmapped pages and the
// results start as NaN, so an access out of bounds or a result left unwritten fails here as it
// would on a GPU; they live on the second emulated device while the first is current, and
// grid-stride launches run again with 3 blocks (differential.h's check). No GPU is needed;
// nothing here times anything.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime_api.h>

#include "differential.h"
#include "op_cases.h"
#include "opforge/backend.h"
#include "opforge/cuda/blaslt.h"
#include "opforge/cuda/scratch.h"

namespace opforge::emulated {
namespace {

#ifdef CUDA_EMU_CUBLASLT_MOCK
// opforge's cuBLASLt loader finds the host libcublasLt (cublaslt_mock.cc) at its first use.
[[maybe_unused]] const bool mock_named = setenv("OPFORGE_CUBLASLT", CUDA_EMU_CUBLASLT_MOCK, 1) == 0;

TEST(CudaEmulated, CublasLtIsTheHostLibrary) {
  EXPECT_NE(cuda::blaslt::status().find(CUDA_EMU_CUBLASLT_MOCK), std::string::npos) << cuda::blaslt::status();
}
#endif

std::vector<std::string> emulated_ops() {
  std::vector<std::string> names;
  for (const OpDef* op : all_ops())
    if (!emulated_dtypes(op->name()).empty()) names.push_back(op->name());
  return names;
}

TEST(CudaEmulated, EveryCudaKernelHasACase) {
  const auto names = emulated_ops();
  EXPECT_GE(names.size(), 25u);  // the emulated kernels registered at all
  for (const auto& name : names) EXPECT_TRUE(cases().count(name)) << name << " has a CUDA kernel but no case in tests/cuda_emulator/op_cases.cc";
}

// Variants for more than 2^32 elements (64-bit indexing), beyond what the emulator can run.
bool needs_four_billion_elements(const std::string& site) { return site.starts_with("finish_rows<T, int64_t>"); }

class AgainstCpu : public ::testing::TestWithParam<std::string> {};

// Every case of `op` (every dtype its CUDA kernel registers, every shape and layout; the matrix
// products on opforge's own kernels, then through cuBLASLt: the host library through opforge's
// loader, or the stand-in), each checked; returns the launch sites that ran.
std::set<std::string> run_all_cases(const std::string& op) {
  const Case& c = cases().at(op);
  std::mt19937 rng(std::hash<std::string>{}(op) & 0xffffffff);
  std::set<std::string> kernels;
  const bool products = op.starts_with("linear_act");
  const int64_t taken_before = cuda::blaslt::calls().taken;
  auto run_cases = [&](bool blaslt) {
    for (DType dtype : emulated_dtypes(op))
      for (int s = 0; s < c.shapes; ++s)
        for (Layout layout : kLayouts) {
          const std::optional<Inputs> in = c.inputs(dtype, s, layout, rng);
          if (!in) continue;  // the variant skips this layout
          std::string what = std::string(dtype_name(dtype)) + " " + layout_name(layout) + " case " +
                             std::to_string(s) + (blaslt ? " (cuBLASLt)" : "");
          for (const auto& t : in->tensors) what += " " + (t ? shape_text(t->shape) : std::string("None"));
          for (const auto& k : check(op, *in, what)) kernels.insert(k);
          if (::testing::Test::HasFailure()) return;  // the first difference says enough
        }
  };
  for (bool blaslt : products ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
    cuda::blaslt::set_enabled(blaslt);
    run_cases(blaslt);
    cuda::blaslt::set_enabled(false);
    if (::testing::Test::HasFailure()) return kernels;
  }
  if (products) EXPECT_GT(cuda::blaslt::calls().taken, taken_before) << "no product went through cuBLASLt";
  EXPECT_FALSE(kernels.empty()) << op << ": no kernel ran in any case";
  if (std::getenv("CUDA_EMU_VERBOSE"))
    for (const auto& k : kernels) std::fprintf(stderr, "%s ran %s\n", op.c_str(), k.c_str());
  return kernels;
}

// Each launch site under `folder` that `kernels` lacks is a failure (the cases reach every variant).
void expect_reached(const std::set<std::string>& kernels, const std::string& folder, const std::string& by) {
  for (const auto& site : cuda_emu::launch_sites())
    if (site.find("(" + folder) != std::string::npos && !kernels.count(site) && !needs_four_billion_elements(site))
      ADD_FAILURE() << by << ": no case reached " << site;
}

TEST_P(AgainstCpu, EveryDtypeShapeAndLayout) {
  const std::string op = GetParam();
  const auto kernels = run_all_cases(op);
  if (!HasFailure()) expect_reached(kernels, "ops/" + op + "/", op);
}

// The shared kernels in include/opforge/cuda (elementwise maps, reductions to a broadcast shape,
// activations, the quantizer): reached by the cases of the ops that use them.
TEST(CudaEmulated, SharedKernelsAreReached) {
  std::set<std::string> kernels;
  for (const char* op : {"add", "add_backward", "relu", "relu_backward", "quantize_q8_0"}) {
    const auto ran = run_all_cases(op);
    kernels.insert(ran.begin(), ran.end());
  }
  if (!HasFailure()) expect_reached(kernels, "include/opforge/cuda/", "the shared kernels");
}

INSTANTIATE_TEST_SUITE_P(Ops, AgainstCpu, ::testing::ValuesIn(emulated_ops()),
                         [](const auto& info) { return info.param; });

// Which kernel a layout reaches: the packed and contiguous-row paths for contiguous aligned rows, the
// general ones otherwise, the fused backward while rows fit.
TEST(CudaEmulated, LayoutsPickTheirKernels) {
  std::mt19937 rng(7);
  auto kernels_for = [&](const std::string& op, const Inputs& in) {
    std::string all;
    for (const auto& k : check(op, in, "path")) all += k + " ";
    return all;
  };
  const Inputs rows{{make(DType::float32, {4, 256}, Layout::contiguous, rng), make(DType::float32, {256}, Layout::contiguous, rng)}, {1e-6}};
  EXPECT_NE(kernels_for("rms_norm", rows).find("contiguous_kernel"), std::string::npos);
  const Inputs odd{{make(DType::float32, {4, 256}, Layout::misaligned, rng), make(DType::float32, {256}, Layout::contiguous, rng)}, {1e-6}};
  EXPECT_NE(kernels_for("rms_norm", odd).find("strided_kernel"), std::string::npos);
  const Inputs back{{make(DType::float32, {300, 64}, Layout::contiguous, rng), make(DType::float32, {300, 64}, Layout::contiguous, rng),
                     make(DType::float32, {64}, Layout::contiguous, rng)}, {1e-6, int64_t{-1}}};
  EXPECT_NE(kernels_for("rms_norm_backward", back).find("fused_kernel"), std::string::npos);
  const Inputs flat{{make(DType::float16, {4100}, Layout::contiguous, rng)}, {}};
  EXPECT_NE(kernels_for("relu", flat).find("map_contiguous"), std::string::npos);
  // a bias row (a whole number of packs) or one value repeats along x in packs; a row of 33 cannot
  const Inputs bias{{make(DType::float16, {9, 64}, Layout::contiguous, rng), make(DType::float16, {64}, Layout::contiguous, rng)}, {}};
  EXPECT_NE(kernels_for("add", bias).find("map_contiguous"), std::string::npos);
  const Inputs scalar{{make(DType::float32, {7, 3}, Layout::contiguous, rng), make(DType::float32, {1}, Layout::contiguous, rng)}, {}};
  EXPECT_NE(kernels_for("mul", scalar).find("map_contiguous"), std::string::npos);
  const Inputs odd_row{{make(DType::float32, {3, 33}, Layout::contiguous, rng), make(DType::float32, {33}, Layout::contiguous, rng)}, {}};
  EXPECT_EQ(kernels_for("add", odd_row).find("map_contiguous"), std::string::npos);
  // x.T: rows side by side go in panels, a warp per row
  HostTensor xt = make(DType::float32, {300, 16}, Layout::contiguous, rng);
  std::swap(xt.shape[0], xt.shape[1]);
  std::swap(xt.strides[0], xt.strides[1]);
  EXPECT_NE(kernels_for("softmax", {{xt}, {}}).find("panel_kernel"), std::string::npos);
  const Inputs norm_t{{xt, make(DType::float32, {300}, Layout::contiguous, rng)}, {1e-6}};
  EXPECT_NE(kernels_for("rms_norm", norm_t).find("panel_kernel"), std::string::npos);
}

// Ops whose contract is the CPU kernel's bits, which the tolerance of the cases above would not see
// broken: matmul_q (matmul_q.h: exact block terms added in double in block order, rounded once; the
// three CUDA kernels: the warp per column for up to 8 rows, the lane per row to 63, the tensor
// cores' tiles beyond) and scatter_add (each
// bucket's rows added in index order, in float32 and float64). A matmul_q term rounded to float, or
// a scatter_add bucket summed out of order, is caught here; the order of matmul_q's double sums
// almost never shows in a float32 result.
TEST(CudaEmulated, OrderedSumsMatchTheCpuBitForBit) {
  std::mt19937 rng(29);
  for (const auto& [op, dtypes, kernel_names] :
       {std::tuple<std::string, std::vector<DType>, std::vector<std::string>>{
            "matmul_q", {DType::float32}, {"gemv_kernel", "rows_kernel", "mma_kernel"}},
        {"scatter_add", {DType::float32, DType::float64}, {"sum_kernel"}}}) {
    const Case& c = cases().at(op);
    std::set<std::string> kernels;
    for (DType dtype : dtypes)
      for (int s = 0; s < c.shapes; ++s) {
        const std::optional<Inputs> in = c.inputs(dtype, s, Layout::contiguous, rng);
        const Outcome cpu = run_on("cpu", op, *in), gpu = run_on(kEmulated, op, *in);
        ASSERT_EQ(cpu.error, "") << op;
        ASSERT_EQ(gpu.error, "") << op;
        EXPECT_TRUE(cpu.results == gpu.results) << op << " " << dtype_name(dtype) << " case " << s << " "
                                                << shape_text(in->tensors[0]->shape);
        kernels.insert(gpu.kernels.begin(), gpu.kernels.end());
      }
    const std::string ran = ::testing::PrintToString(kernels);
    for (const auto& name : kernel_names) EXPECT_NE(ran.find(name), std::string::npos) << op << ": " << ran;
  }
}

// test_cuda.py's test_cublaslt_takes_aligned_half_types, here: tensor-core shapes in a half type go
// through cuBLASLt, forward (one product) and backward (z, then grad_x and grad_weight in two
// parts each), and agree with the CPU kernels.
TEST(CudaEmulated, CublasLtTakesAlignedHalfTypes) {
  std::mt19937 rng(13);
  for (DType dtype : {DType::float16, DType::bfloat16}) {
    auto eighth = [](std::mt19937& r) { return normal(r) / 8; };
    const HostTensor x = make(dtype, {64, 128}, Layout::contiguous, rng, eighth);
    const HostTensor w = make(dtype, {96, 128}, Layout::contiguous, rng, eighth);
    const HostTensor b = make(dtype, {96}, Layout::contiguous, rng, eighth);
    const HostTensor g = make(dtype, {64, 96}, Layout::contiguous, rng, eighth);
    const bool was = cuda::blaslt::set_enabled(true);
    const int64_t taken = cuda::blaslt::calls().taken;
    check("linear_act", {{x, w, b}, {std::string("gelu")}}, "aligned half types");
    const int64_t forward = cuda::blaslt::calls().taken - taken;
    check("linear_act_backward", {{g, x, w, b, std::nullopt}, {std::string("gelu"), int64_t{-1}}}, "aligned half types");
    const int64_t backward = cuda::blaslt::calls().taken - taken - forward;
    cuda::blaslt::set_enabled(was);
    // Each check runs the op four times on the device (forward turns, reverse turns, few blocks,
    // capturing a graph).
    EXPECT_EQ(forward, 4) << dtype_name(dtype);
    EXPECT_EQ(backward, 4 * 5) << dtype_name(dtype);
  }
}

// float16 gradients near its largest value (65504) through gelu's slope (up to 1.13): g passes
// float16's range, so its two cuBLASLt parts must not be g rounded to float16 (inf, then NaN in
// every product it enters). The saved-preact and the recomputing paths, against the CPU's float g.
TEST(CudaEmulated, HalfGradientsPastFloat16sRangeThroughCublasLt) {
  std::mt19937 rng(14);
  auto near = [](double v, double spread) { return [=](std::mt19937& r) { return v + spread * normal(r); }; };
  // 59000 to 64000 (float16 holds them), times gelu's slope at 1.5 (1.127): g of 66000 to 72000.
  const HostTensor grad = make(DType::float16, {32, 64}, Layout::contiguous, rng,
                               [](std::mt19937& r) { return 59000.0 + double(r() % 5000); });
  const HostTensor x = make(DType::float16, {32, 128}, Layout::contiguous, rng, near(0, 1e-3));
  const HostTensor w = make(DType::float16, {64, 128}, Layout::contiguous, rng, near(0, 1e-3));
  const HostTensor bias = make(DType::float16, {64}, Layout::contiguous, rng, near(1.5, 0.05));
  const HostTensor preact = make(DType::float16, {32, 64}, Layout::contiguous, rng, near(1.5, 0.05));
  const bool was = cuda::blaslt::set_enabled(true);
  const int64_t taken = cuda::blaslt::calls().taken;
  check("linear_act_backward", {{grad, x, w, bias, preact}, {std::string("gelu"), int64_t{-1}}}, "saved preact");
  check("linear_act_backward", {{grad, x, w, bias, std::nullopt}, {std::string("gelu"), int64_t{-1}}}, "recomputed");
  EXPECT_GT(cuda::blaslt::calls().taken, taken) << "the products did not reach cuBLASLt";
  cuda::blaslt::set_enabled(was);
}

// opforge's CUDA backend (src/backends/cuda_backend.cu, compiled here as the emulated devices')
// as the DLPack path uses it for CuPy arrays: memory on the array's device, which is not the
// current one, made on the caller's stream; a fence recorded there; release waiting for it on the
// thread's own stream (the caller's may be gone), then freeing memory and event; the caller's
// current device put back after each call.
TEST(CudaEmulated, TheCudaBackendWorksOnTheArraysDeviceAndPutsTheCallersBack) {
  Backend* cuda = lookup_backend(kEmulated);
  ASSERT_NE(cuda, nullptr);
  EXPECT_TRUE(cuda->available());
  EXPECT_EQ(cuda->unavailable_reason(), "");
  EXPECT_EQ(cuda->device_count(), cuda_emu::kDevices);
  const size_t live = cuda_emu::live_allocations();
  const Device device{DeviceType::cuda, kTensorDevice};
  cuda_emu::take_stream_uses();
  void* p = cuda->allocate(64, device, kCallerStream);
  void* empty = cuda->allocate(0, device, kCallerStream);  // an empty result's pointer is its own too
  EXPECT_NE(p, empty);
  const std::vector<unsigned char> bytes(64, 7);
  cuda->copy(p, bytes.data(), 64, kCallerStream);
  EXPECT_EQ(std::memcmp(p, bytes.data(), 64), 0);
  cuda->synchronize(device, kCallerStream);
  void* fence = cuda->fence(device, kCallerStream);
  EXPECT_EQ(cuda_emu::live_events(), 1u);
  cuda->release(p, device, fence);
  cuda->release(empty, device, nullptr);
  EXPECT_EQ(cuda_emu::live_events(), 0u) << "the fence's event was not destroyed";
  EXPECT_EQ(cuda_emu::live_allocations(), live);
  EXPECT_EQ(cuda->current_device(), 0);
  const void* own = cudaStreamPerThread;
  const std::vector<std::tuple<std::string, const void*, int>> want{
      {"cudaMallocFromPoolAsync", kCallerStream, 1}, {"cudaMallocFromPoolAsync", kCallerStream, 1},
      {"cudaMemcpyAsync", kCallerStream, 0},    // a copy may go to another device's stream
      {"cudaStreamSynchronize", kCallerStream, 1}, {"cudaEventRecord", kCallerStream, 1},
      {"cudaStreamWaitEvent", own, 1},          {"cudaFreeAsync", own, 1},
      {"cudaFreeAsync", own, 1}};
  std::vector<std::tuple<std::string, const void*, int>> got;
  for (const auto& use : cuda_emu::take_stream_uses()) got.emplace_back(use.what, use.stream, use.device);
  EXPECT_EQ(got, want);
}

// A CUDA runtime call the backend refuses (a device that does not exist, memory the device cannot
// give) raises its error naming the call, leaves the current device as it was, and does not stay
// behind as the runtime's last error for the next op's launch check to report as its own.
TEST(CudaEmulated, TheCudaBackendsErrorsDoNotLingerIntoTheNextOp) {
  Backend* cuda = lookup_backend(kEmulated);
  ASSERT_NE(cuda, nullptr);
  std::mt19937 rng(15);
  const Inputs next{{make(DType::float32, {8}, Layout::contiguous, rng)}, {}};
  try {
    cuda->allocate(64, Device{DeviceType::cuda, 5}, kCallerStream);
    ADD_FAILURE() << "allocating on device 5 of 2 did not fail";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "cuda backend: cudaSetDevice failed: invalid device ordinal");
  }
  EXPECT_EQ(cuda->current_device(), 0);
  EXPECT_EQ(run_on(kEmulated, "add_one", next).error, "");
  const size_t limit = cuda_emu::set_allocation_limit(1024);
  try {
    cuda->allocate(4096, Device{DeviceType::cuda, kTensorDevice}, kCallerStream);
    ADD_FAILURE() << "allocating past the limit did not fail";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "cuda backend: allocating from its pool failed: out of memory");
  }
  cuda_emu::set_allocation_limit(limit);
  EXPECT_EQ(cuda->current_device(), 0);
  EXPECT_EQ(run_on(kEmulated, "add_one", next).error, "");
}

// An index value out of range is found on the device (read_kernel's atomicMin, copied back once the
// op's kernels are queued; they stay in bounds meanwhile) and raised with the CPU kernel's words:
// the op, the value, its position. Also where nothing is in range (dim_size 0, grad with no rows),
// where the kernels must not read a row that is not there.
TEST(CudaEmulated, AnIndexOutOfRangeIsFoundOnTheDevice) {
  std::mt19937 rng(11);
  auto expect_cpus_error = [](const Inputs& forward, const Inputs& backward, const std::string& words) {
    for (const auto& [op, in] : {std::pair{"scatter_add", forward}, std::pair{"scatter_add_backward", backward}}) {
      const Outcome cpu = run_on("cpu", op, in), gpu = run_on(kEmulated, op, in);
      EXPECT_NE(gpu.error.find(words), std::string::npos) << op << ": " << gpu.error;
      EXPECT_EQ(gpu.error, cpu.error) << op;
    }
  };
  for (DType index_dtype : {DType::int32, DType::int64}) {
    HostTensor index = make(index_dtype, {6}, Layout::contiguous, rng, [](std::mt19937& r) { return double(r() % 7); });
    from_double(index.bytes.data() + 3 * dtype_size(index_dtype), index_dtype, 7);
    from_double(index.bytes.data() + 5 * dtype_size(index_dtype), index_dtype, -1);
    expect_cpus_error({{make(DType::float32, {6, 4}, Layout::contiguous, rng), index}, {int64_t{7}, int64_t{0}}},
                      {{make(DType::float32, {7, 4}, Layout::contiguous, rng), index}, {int64_t{0}}},
                      "got 7 at position 3");
  }
  const HostTensor index = make(DType::int64, {3}, Layout::contiguous, rng, [](std::mt19937& r) { return double(r() % 2); });
  expect_cpus_error({{make(DType::float32, {3, 4}, Layout::contiguous, rng), index}, {int64_t{0}, int64_t{0}}},
                    {{make(DType::float32, {0, 4}, Layout::contiguous, rng), index}, {int64_t{0}}}, "at position 0");
}

// The index check's one wait is for the check alone: its result's copy and an event are queued
// right behind its kernel, and the event is waited for after every kernel of the op is queued. The
// stream is never waited for, so the call returns while the sums run and the next call's launches
// queue behind them (waiting for the stream left the H200 idle 46 of every 168 us of scatter_add).
TEST(CudaEmulated, TheIndexCheckWaitsForTheCheckAloneAfterTheLastLaunch) {
  std::mt19937 rng(20);
  const HostTensor index = make(DType::int32, {9}, Layout::contiguous, rng, [](std::mt19937& r) { return double(r() % 5); });
  const Inputs forward{{make(DType::float32, {9, 6}, Layout::contiguous, rng), index}, {int64_t{5}, int64_t{0}}};
  const Inputs backward{{make(DType::float32, {5, 6}, Layout::contiguous, rng), index}, {int64_t{0}}};
  for (const auto& [op, in] : {std::pair{"scatter_add", forward}, std::pair{"scatter_add_backward", backward}}) {
    const Outcome gpu = run_on(kEmulated, op, in);
    EXPECT_EQ(gpu.error, "") << op;
    size_t i = 0, record_at = 0, wait_at = 0, last_launch = 0;
    int records = 0, event_waits = 0, stream_waits = 0;
    std::vector<std::string> before_record;  // the kernels launched before the event
    for (const std::string& use : gpu.stream_uses) {
      ++i;
      if (use == "cudaStreamSynchronize" || use == "cudaDeviceSynchronize") {
        ++stream_waits;
      } else if (use == "cudaEventRecord") {
        ++records, record_at = i;
      } else if (use == "cudaEventSynchronize") {
        ++event_waits, wait_at = i;
      } else if (!use.starts_with("cuda")) {  // a kernel's name
        last_launch = i;
        if (!record_at) before_record.push_back(use);
      }
    }
    EXPECT_EQ(stream_waits, 0) << op;
    EXPECT_EQ(records, 1) << op;
    EXPECT_EQ(event_waits, 1) << op;
    ASSERT_EQ(before_record.size(), 1u) << op << ": the event is not right behind the check";
    EXPECT_NE(before_record[0].find("read_kernel"), std::string::npos) << op << ": " << before_record[0];
    EXPECT_GT(last_launch, record_at) << op << ": no kernel queued after the check";
    EXPECT_GT(wait_at, last_launch) << op << ": the wait came before the last kernel was queued";
  }
}

// A workspace the device cannot hold raises a runtime error naming the op, and the next op runs
// (the runtime keeps a failed call's status as its last error until someone reads it).
TEST(CudaEmulated, OutOfMemoryIsReportedOnce) {
  std::mt19937 rng(12);
  const size_t limit = cuda_emu::set_allocation_limit(size_t{1} << 20);
  const Inputs in{{make(DType::float16, {3, 1}, Layout::contiguous, rng),
                   make(DType::int64, {3}, Layout::contiguous, rng, [](std::mt19937&) { return 0.0; })},
                  {int64_t{1} << 18, int64_t{0}}};  // bucket starts: 2 MiB of workspace
  const Outcome failed = run_on(kEmulated, "scatter_add", in);
  cuda_emu::set_allocation_limit(limit);
  EXPECT_TRUE(failed.error.starts_with("scatter_add(): cannot allocate ") &&
              failed.error.ends_with(" bytes of workspace: out of memory"))
      << failed.error;
  const Outcome next = run_on(kEmulated, "add_one", {{make(DType::float32, {8}, Layout::contiguous, rng)}, {}});
  EXPECT_EQ(next.error, "");
}

// Inside a CUDA graph capture, scatter_add and its backward raise before their index check would
// wait for the device (the wait would end the capture on a GPU); every other op is captured
// (differential.h's check runs every case so).
TEST(CudaEmulated, IndexCheckingOpsRefuseAGraphCaptureBeforeWaiting) {
  std::mt19937 rng(18);
  HostTensor index = make(DType::int64, {6}, Layout::contiguous, rng, [](std::mt19937& r) { return double(r() % 4); });
  const Inputs forward{{make(DType::float32, {6, 3}, Layout::contiguous, rng), index}, {int64_t{4}, int64_t{0}}};
  const Inputs backward{{make(DType::float32, {4, 3}, Layout::contiguous, rng), index}, {int64_t{0}}};
  for (const auto& [op, in] : {std::pair{"scatter_add", forward}, std::pair{"scatter_add_backward", backward}}) {
    cuda_emu::set_capturing_stream(kCallerStream);
    const Outcome captured = run_on(kEmulated, op, in);
    cuda_emu::set_capturing_stream(nullptr);
    EXPECT_EQ(captured.error, std::string(op) + "(): cannot run inside a CUDA graph capture: its index check waits for the device");
    EXPECT_EQ(run_on(kEmulated, op, in).error, "") << op << " after the capture";
  }
}

int64_t pool_allocations(int device) {
  int64_t n = 0;
  for (const auto& pool : cuda_emu::pool_states())
    if (pool.device == device) n += pool.allocations;
  return n;
}

// A kernel's workspaces come from the framework's allocator when the adapter hands one over (torch's
// caching allocator, XLA's scratch allocator: memory the framework can also give its own ops), all
// of it given back by the call's end; else from opforge's pool on the tensors' device, made to keep
// memory across synchronizations (the runtime's default pool gives it back to the driver at each).
TEST(CudaEmulated, WorkspacesComeFromTheFrameworkElseFromOpforgesPool) {
  std::mt19937 rng(16);
  const Inputs in{{make(DType::float32, {300, 40}, Layout::contiguous, rng), make(DType::float32, {300, 40}, Layout::contiguous, rng),
                   make(DType::float32, {40}, Layout::contiguous, rng)},
                  {1e-5, int64_t{3}}};  // rms_norm_backward: grad_weight's partial sums need a workspace
  const Outcome cpu = run_on("cpu", "rms_norm_backward", in);
  const int64_t pooled = pool_allocations(kTensorDevice);
  FrameworkScratch framework;
  EXPECT_TRUE(same_results("from the framework", cpu, run_on(kEmulated, "rms_norm_backward", in, &framework)));
  EXPECT_GT(framework.allocations(), 0);
  EXPECT_EQ(framework.live(), 0u);
  EXPECT_EQ(pool_allocations(kTensorDevice), pooled) << "the pool was used beside the framework's allocator";

  EXPECT_TRUE(same_results("from the pool", cpu, run_on(kEmulated, "rms_norm_backward", in)));
  EXPECT_GT(pool_allocations(kTensorDevice), pooled);
  bool found = false;
  for (const auto& pool : cuda_emu::pool_states())
    if (pool.device == kTensorDevice) {
      EXPECT_FALSE(found) << "a second pool for device " << kTensorDevice;
      EXPECT_EQ(pool.release_threshold, cuda::kPoolKeepBytes);
      found = true;
    }
  EXPECT_TRUE(found);

  framework.set_room(false);  // the framework is out of memory: the op says so, naming itself
  const Outcome refused = run_on(kEmulated, "rms_norm_backward", in, &framework);
  EXPECT_TRUE(refused.error.starts_with("rms_norm_backward(): cannot allocate ")) << refused.error;
}

#ifdef CUDA_EMU_CUBLASLT_MOCK
// cuBLASLt gets the workspace its algorithm asks for (the heuristic is offered 32 MiB on sm_90),
// from the call's allocator; where there is no room it declines, and opforge's own kernel, which
// needs none, computes the product instead of the op failing.
TEST(CudaEmulated, CublasLtsWorkspaceComesFromTheCallAndNoRoomFallsBack) {
  std::mt19937 rng(17);
  const Inputs in{{make(DType::float32, {33, 64}, Layout::contiguous, rng), make(DType::float32, {48, 64}, Layout::contiguous, rng),
                   make(DType::float32, {48}, Layout::contiguous, rng)},
                  {std::string("none")}};
  const Outcome cpu = run_on("cpu", "linear_act", in);
  const bool was = cuda::blaslt::set_enabled(true);
  const auto before = cuda::blaslt::calls();
  FrameworkScratch framework;
  EXPECT_TRUE(same_results("cuBLASLt", cpu, run_on(kEmulated, "linear_act", in, &framework)));
  EXPECT_EQ(cuda::blaslt::calls().taken, before.taken + 1);
  EXPECT_EQ(framework.allocations(), 1) << "cuBLASLt's workspace";
  framework.set_room(false);
  EXPECT_TRUE(same_results("no room for cuBLASLt's workspace", cpu, run_on(kEmulated, "linear_act", in, &framework)));
  EXPECT_EQ(cuda::blaslt::calls().taken, before.taken + 1);
  EXPECT_EQ(cuda::blaslt::calls().declined, before.declined + 1);
  cuda::blaslt::set_enabled(was);
}
#endif

}  // namespace
}  // namespace opforge::emulated
