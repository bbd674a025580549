// The differential harness of the emulated CUDA tests: random host tensors in contiguous,
// misaligned and strided layouts, one run of an op on the CPU or on the emulated device (inputs
// copied into the emulated device's guarded memory, results starting as NaN, every launch checked
// to use the caller's stream, the inputs checked unchanged), and the comparison of two runs.
#pragma once

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
#include <vector>

#include "../cpp/test_util.h"
#include "emulator.h"
#include "opforge/dispatch.h"
#include "opforge/half.h"
#include "opforge/kernel.h"
#include "opforge/registry.h"

namespace opforge::emulated {

inline constexpr const char* kEmulated = "cuda_emulated";
// The stream the tests hand the kernels, as a framework would hand its current one.
inline void* const kCallerStream = reinterpret_cast<void*>(0x5eed);
// The emulated tensors live on the second device while the calling thread's current device is the
// first: the call must launch everything on theirs and put the caller's back.
inline constexpr int kTensorDevice = 1;

enum class Layout { contiguous, misaligned, strided };
inline constexpr Layout kLayouts[] = {Layout::contiguous, Layout::misaligned, Layout::strided};
inline const char* layout_name(Layout l) {
  return l == Layout::contiguous ? "contiguous" : l == Layout::misaligned ? "misaligned" : "strided";
}

inline double to_double(const unsigned char* p, DType dtype) {
  switch (dtype) {
    case DType::float32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::float64: { double v; std::memcpy(&v, p, 8); return v; }
    case DType::float16: { float16 v; std::memcpy(&v, p, 2); return to_float(v); }
    case DType::bfloat16: { bfloat16 v; std::memcpy(&v, p, 2); return to_float(v); }
    case DType::int32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::int64: { int64_t v; std::memcpy(&v, p, 8); return double(v); }
    case DType::uint8: return *p;
    default: ADD_FAILURE() << "no conversion for " << dtype_name(dtype); return 0;
  }
}

inline void from_double(unsigned char* p, DType dtype, double x) {
  switch (dtype) {
    case DType::float32: { float v = float(x); std::memcpy(p, &v, 4); return; }
    case DType::float64: std::memcpy(p, &x, 8); return;
    case DType::float16: { float16 v = to_float16(float(x)); std::memcpy(p, &v, 2); return; }
    case DType::bfloat16: { bfloat16 v = to_bfloat16(float(x)); std::memcpy(p, &v, 2); return; }
    case DType::int32: { int32_t v = int32_t(x); std::memcpy(p, &v, 4); return; }
    case DType::int64: { int64_t v = int64_t(x); std::memcpy(p, &v, 8); return; }
    case DType::uint8: *p = static_cast<unsigned char>(x); return;
    default: ADD_FAILURE() << "no conversion for " << dtype_name(dtype);
  }
}

// A tensor's host storage and how the op sees it (shape, strides, offset into the storage).
struct HostTensor {
  DType dtype;
  Dims shape, strides;
  int64_t offset = 0;  // elements
  std::vector<unsigned char> bytes;

  TensorView view(void* base, Device device) const {
    return testing::view(static_cast<unsigned char*>(base) + offset * dtype_size(dtype), dtype, shape, strides,
                         device);
  }
};

using Fill = std::function<double(std::mt19937&)>;
inline double normal(std::mt19937& rng) { return std::normal_distribution<double>(0, 1)(rng); }

// Random values from `fill`, or normal ones without one (integers: normal x 1000, rounded, and one
// in eight the type's extremes).
inline HostTensor make(DType dtype, Dims shape, Layout layout, std::mt19937& rng, const Fill& fill = {}) {
  HostTensor t{dtype, shape, contiguous_strides(shape)};
  if (layout == Layout::strided) t.strides = testing::random_strides(shape, rng);
  if (layout == Layout::misaligned) t.offset = 1;
  int64_t span = 1, numel = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    numel *= shape[d];
    if (shape[d] > 0) span += (shape[d] - 1) * t.strides[d];
  }
  const int64_t elements = t.offset + (numel == 0 ? 0 : span);
  const int64_t size = dtype_size(dtype);
  t.bytes.resize(std::max<int64_t>(elements, 1) * size);
  const bool integral = dtype == DType::int32 || dtype == DType::int64;
  for (int64_t i = 0; i < elements; ++i) {
    unsigned char* at = t.bytes.data() + i * size;
    if (integral && !fill && rng() % 8 == 0) {  // the type's extremes: sums and products wrap
      const int64_t big = dtype == DType::int32 ? INT32_MAX : INT64_MAX;
      const int64_t v = std::vector<int64_t>{big, -big - 1, big - 1, -big}[rng() % 4];
      if (dtype == DType::int32) {
        const int32_t v32 = int32_t(v);
        std::memcpy(at, &v32, 4);
      } else {
        std::memcpy(at, &v, 8);
      }
      continue;
    }
    double v = fill ? fill(rng) : normal(rng);
    if (integral) v = std::round(fill ? v : v * 1000);
    from_double(at, dtype, v);
  }
  return t;
}

using Tensors = std::vector<std::optional<HostTensor>>;
struct Inputs {
  Tensors tensors;
  std::vector<AttrValue> attrs;
};

// One run of an op on a backend: the results' bytes, or the error it raised, the kernels the
// emulator launched and everything that ran on a stream (launches and runtime calls, in order).
// On the emulated device, an input whose storage changed fails the test.
struct Outcome {
  Outputs specs;
  std::vector<std::vector<unsigned char>> results;
  std::string error;
  std::vector<std::string> kernels;
  std::vector<std::string> stream_uses;
};

// What a run on the emulated device must leave behind: every launch and stream-ordered runtime call
// on the caller's stream with the tensors' device current, the caller's current device back, the
// inputs' storage (gaps between strided elements too) unchanged, and nothing written beside an
// allocation (its release checks). Releases the run's device memory.
inline void expect_clean_device_run(const std::string& name, const Inputs& inputs, const std::vector<void*>& memory,
                                    const std::vector<cuda_emu::StreamUse>& stream_uses) {
  for (const auto& use : stream_uses) {
    if (use.stream != kCallerStream)
      ADD_FAILURE() << name << ": " << use.what << " on stream " << use.stream << ", not the caller's";
    if (use.device != kTensorDevice)
      ADD_FAILURE() << name << ": " << use.what << " with device " << use.device << " current, not the tensors' ("
                    << kTensorDevice << ")";
  }
  if (cuda_emu::current_device() != 0) ADD_FAILURE() << name << ": the caller's current device was not put back";
  for (size_t i = 0, d = 0; i < inputs.tensors.size(); ++i)
    if (inputs.tensors[i] && std::memcmp(memory[d++], inputs.tensors[i]->bytes.data(), inputs.tensors[i]->bytes.size()))
      ADD_FAILURE() << name << ": input " << i << " changed on the device";
  for (void* p : memory) {
    try {
      cuda_emu::release(p);
    } catch (const cuda_emu::KernelFault& e) {  // a stray write beside an input or a result
      ADD_FAILURE() << name << ": " << e.what();
    }
  }
  for (const auto& fault : cuda_emu::take_memory_faults())  // beside the op's own workspaces
    ADD_FAILURE() << name << ": " << fault << " (a workspace the op freed)";
}

// A framework's allocator for the kernels' workspaces, as torch's caching allocator or XLA's
// scratch allocator would hand one over: emulated device memory of its own, counted. Everything
// it gave must be given back by the end of the call (stray writes beside it found then).
class FrameworkScratch final : public ScratchAllocator {
 public:
  void* allocate(size_t bytes) override {
    ++allocations_;
    if (!room_) return nullptr;
    void* p = cuda_emu::allocate(bytes);
    live_.insert(p);
    return p;
  }
  void release(void* p) noexcept override {
    if (!live_.erase(p)) cuda_emu::note_memory_fault("FrameworkScratch::release of memory it did not give");
    try {
      cuda_emu::release(p);
    } catch (const cuda_emu::KernelFault& e) {
      cuda_emu::note_memory_fault(e.what());
    }
  }
  // How many allocations were asked for; the ones not yet given back.
  int64_t allocations() const { return allocations_; }
  size_t live() const { return live_.size(); }
  // Without room, every allocation fails (nullptr), as a framework's out of memory.
  void set_room(bool room) { room_ = room; }

 private:
  int64_t allocations_ = 0;
  std::set<void*> live_;
  bool room_ = true;
};

// One run of `name` on `backend`; on the emulated device, the kernels' workspaces come from
// `scratch` (a framework's allocator) or, without one, opforge's pool.
inline Outcome run_on(const std::string& backend, const std::string& name, const Inputs& inputs,
                      ScratchAllocator* scratch = nullptr) {
  const OpDef& op = find_op(name);
  const bool emulated = backend == kEmulated;
  const Device device = emulated ? Device{DeviceType::cuda, kTensorDevice} : Device{};
  std::vector<void*> device_memory;
  auto place = [&](const std::vector<unsigned char>& bytes) -> void* {
    if (!emulated) return const_cast<unsigned char*>(bytes.data());
    void* p = cuda_emu::allocate(bytes.size());
    std::memcpy(p, bytes.data(), bytes.size());
    device_memory.push_back(p);
    return p;
  };
  OpInputs in;
  in.attrs = inputs.attrs;
  for (const auto& t : inputs.tensors)
    in.tensors.push_back(t ? std::optional<TensorView>(t->view(place(t->bytes), device)) : std::nullopt);

  Outcome out;
  cuda_emu::take_launches();
  cuda_emu::take_stream_uses();
  cuda_emu::take_unchecked_launch();
  cuda_emu::take_unwaited_copies();
  cuda_emu::take_memory_faults();
  set_backend_override("", backend);
  try {
    out.specs = infer_outputs(op, in);
    std::vector<TensorView> views;
    for (const auto& spec : out.specs) {
      int64_t n = 1;
      for (int64_t s : spec.shape) n *= s;
      out.results.emplace_back(size_t(n * dtype_size(spec.dtype)), 0xff);
      views.push_back(testing::view(place(out.results.back()), spec.dtype, spec.shape, spec.strides, device));
    }
    run_kernel(op, select_kernel(op, in), in, views, emulated ? kCallerStream : nullptr, emulated ? scratch : nullptr);
    if (const std::string k = cuda_emu::take_unchecked_launch(); !k.empty())
      ADD_FAILURE() << name << ": " << k << " was launched and no cudaGetLastError followed (every launch is checked)";
    if (const size_t n = cuda_emu::take_unwaited_copies())
      ADD_FAILURE() << name << ": " << n << " copies to host memory were never waited for";
    for (size_t i = 0; i < views.size(); ++i)
      if (!out.results[i].empty()) std::memcpy(out.results[i].data(), views[i].data, out.results[i].size());
  } catch (const Error& e) {
    out.error = e.what();
  }
  set_backend_override("", "");
  out.kernels = cuda_emu::take_launches();
  const std::vector<cuda_emu::StreamUse> uses = cuda_emu::take_stream_uses();
  for (const auto& use : uses) out.stream_uses.push_back(use.what);
  if (emulated) expect_clean_device_run(name, inputs, device_memory, uses);
  return out;
}

// Allowed difference from the CPU kernel, relative to |cpu value| + the result's RMS (at least 1:
// the inputs are O(1), so a result's terms are too, and a cancellation leaves their rounding, as a
// layer norm of one element, 0 from terms of 1/sqrt(eps)). Both round each result once but sum in
// different orders (blocks, warps, tiles).
inline double tolerance(DType dtype) {
  switch (dtype) {
    case DType::float64: return 1e-10;
    case DType::float32: return 2e-4;
    case DType::float16: return 4e-3;
    case DType::bfloat16: return 3e-2;
    default: return 0;  // integers and quantized bytes: exact
  }
}

inline ::testing::AssertionResult same_results(const std::string& what, const Outcome& cpu, const Outcome& gpu) {
  if (cpu.error != gpu.error) {
    if (cpu.error.empty()) return ::testing::AssertionFailure() << what << ": cuda raised \"" << gpu.error << "\"";
    if (gpu.error.empty()) return ::testing::AssertionFailure() << what << ": cpu raised \"" << cpu.error << "\", cuda did not";
  }
  if (!cpu.error.empty()) {  // both refused (messages may differ by backend)
    if (std::getenv("CUDA_EMU_VERBOSE")) std::fprintf(stderr, "%s: both refused: %s | %s\n", what.c_str(), cpu.error.c_str(), gpu.error.c_str());
    return ::testing::AssertionSuccess();
  }
  for (size_t r = 0; r < cpu.results.size(); ++r) {
    const DType dtype = cpu.specs[r].dtype;
    const int64_t size = dtype_size(dtype), n = int64_t(cpu.results[r].size()) / size;
    double rms = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = to_double(cpu.results[r].data() + i * size, dtype);
      if (std::isfinite(v)) rms += v * v / n;
    }
    rms = std::max(std::sqrt(rms), 1.0);
    int64_t bad = 0, first = -1;
    double first_cpu = 0, first_gpu = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double c = to_double(cpu.results[r].data() + i * size, dtype);
      const double g = to_double(gpu.results[r].data() + i * size, dtype);
      const bool ok = tolerance(dtype) == 0  // integers and bytes: exactly, bit for bit
                          ? std::memcmp(cpu.results[r].data() + i * size, gpu.results[r].data() + i * size, size) == 0
                      : std::isnan(c) ? std::isnan(g)
                                      : std::abs(g - c) <= tolerance(dtype) * (std::abs(c) + rms) || g == c;
      if (!ok && bad++ == 0) first = i, first_cpu = c, first_gpu = g;
    }
    if (bad)
      return ::testing::AssertionFailure() << what << ": result " << r << " (" << dtype_name(dtype) << ", "
                                           << n << " values): " << bad << " differ; first at " << first
                                           << ": cuda " << first_gpu << ", cpu " << first_cpu << " (kernels "
                                           << ::testing::PrintToString(gpu.kernels) << ")";
  }
  return ::testing::AssertionSuccess();
}

// Runs the case on the CPU and the emulated GPU and compares; then again on the GPU with blocks and
// threads taking turns in reverse and the workspaces from a framework's allocator instead of
// opforge's pool, which must give the same bits (opforge's CUDA kernels are deterministic, and a
// difference is a race); then with grid-stride launches cut to 3 blocks, so
// their loops take several trips (a kernel that assumed one would leave results unwritten),
// compared with the CPU again (fewer blocks may sum in another order); then with the caller's
// stream capturing a CUDA graph. Returns the emulated kernels' names.
inline std::vector<std::string> check(const std::string& op, const Inputs& inputs, const std::string& what) {
  const size_t live = cuda_emu::live_allocations();
  const Outcome cpu = run_on("cpu", op, inputs);
  const Outcome gpu = run_on(kEmulated, op, inputs);
  EXPECT_TRUE(same_results(op + " " + what, cpu, gpu));
  cuda_emu::set_schedule(cuda_emu::Schedule::reverse);
  FrameworkScratch framework;  // the reversed run's workspaces come from a framework's allocator
  const Outcome reversed = run_on(kEmulated, op, inputs, &framework);
  cuda_emu::set_schedule(cuda_emu::Schedule::forward);
  EXPECT_EQ(framework.live(), 0u) << op << " " << what << ": workspaces not given back to the framework";
  EXPECT_EQ(reversed.error, gpu.error) << op << " " << what;
  EXPECT_TRUE(reversed.results == gpu.results)
      << op << " " << what << ": the results depend on the order the threads run in (a race), kernels "
      << ::testing::PrintToString(gpu.kernels);
  const int64_t cap = cuda_emu::set_grid_cap(3);
  const Outcome few_blocks = run_on(kEmulated, op, inputs);
  cuda_emu::set_grid_cap(cap);
  EXPECT_TRUE(same_results(op + " " + what + " (3 blocks per grid-stride launch)", cpu, few_blocks));
  // Inside a CUDA graph capture the op must not wait for the device (that would end the capture);
  // an op that must wait says so instead, and every other gives the same bits.
  const Outcome captured = [&] {
    struct Capture {  // ended however the run ends (a fault throws)
      Capture() { cuda_emu::set_capturing_stream(kCallerStream); }
      ~Capture() { cuda_emu::set_capturing_stream(nullptr); }
    } capture;
    return run_on(kEmulated, op, inputs);
  }();
  if (captured.error != gpu.error)
    EXPECT_NE(captured.error.find("cannot run inside a CUDA graph capture"), std::string::npos)
        << op << " " << what << " while capturing: " << captured.error;
  else
    EXPECT_TRUE(captured.results == gpu.results) << op << " " << what << ": other bits while capturing a CUDA graph";
  EXPECT_EQ(cuda_emu::live_allocations(), live) << op << " " << what << ": device memory left allocated";
  return gpu.kernels;
}

inline std::vector<DType> emulated_dtypes(const std::string& op) {
  for (const auto& k : kernels_of(op))
    if (k.backend == kEmulated) return k.dtypes;
  return {};
}

inline std::string shape_text(const Dims& s) { return ::testing::PrintToString(s); }


}  // namespace opforge::emulated
