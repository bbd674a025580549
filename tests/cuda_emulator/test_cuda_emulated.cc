// Every op's CUDA kernels, run by the host emulator (cuda_emulator.h), against the op's CPU kernel
// on the same random inputs: every dtype the CUDA kernel registers, contiguous, misaligned (one
// element in, so no 16-byte packs) and strided or broadcast views, empty and odd sizes, and the
// shapes that pick each kernel variant (cached rows, fused backward chunks, tiled products). The
// inputs live in the emulated device's memory between unmapped pages and the results start as
// NaN, so an access out of bounds or a result left unwritten fails here as it would on a GPU.
// Workspaces must all be freed again. No GPU is needed; nothing here times anything.
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

#include "emulator.h"
#include "opforge/cuda/blaslt.h"
#include "opforge/dispatch.h"
#include "opforge/half.h"
#include "opforge/registry.h"
#include "../cpp/test_util.h"

namespace opforge {
namespace {

constexpr const char* kEmulated = "cuda_emulated";
// The stream the tests hand the kernels, as a framework would hand its current one.
void* const kCallerStream = reinterpret_cast<void*>(0x5eed);

#ifdef CUDA_EMU_CUBLASLT_MOCK
// opforge's cuBLASLt loader finds the host libcublasLt (cublaslt_mock.cc) at its first use.
[[maybe_unused]] const bool mock_named = setenv("OPFORGE_CUBLASLT", CUDA_EMU_CUBLASLT_MOCK, 1) == 0;

TEST(CudaEmulated, CublasLtIsTheHostLibrary) {
  EXPECT_NE(cuda::blaslt::status().find(CUDA_EMU_CUBLASLT_MOCK), std::string::npos) << cuda::blaslt::status();
}
#endif

enum class Layout { contiguous, misaligned, strided };
const Layout kLayouts[] = {Layout::contiguous, Layout::misaligned, Layout::strided};
const char* layout_name(Layout l) {
  return l == Layout::contiguous ? "contiguous" : l == Layout::misaligned ? "misaligned" : "strided";
}

double to_double(const unsigned char* p, DType dtype) {
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

void from_double(unsigned char* p, DType dtype, double x) {
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
  std::vector<int64_t> shape, strides;
  int64_t offset = 0;  // elements
  std::vector<unsigned char> bytes;

  TensorView view(void* base, Device device) const {
    return testing::view(static_cast<unsigned char*>(base) + offset * dtype_size(dtype), dtype, shape, strides,
                         device);
  }
};

using Fill = std::function<double(std::mt19937&)>;
double normal(std::mt19937& rng) { return std::normal_distribution<double>(0, 1)(rng); }

// Random values from `fill`, or normal ones without one (integers: normal x 1000, rounded, and one
// in eight the type's extremes).
HostTensor make(DType dtype, std::vector<int64_t> shape, Layout layout, std::mt19937& rng, const Fill& fill = {}) {
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

// One run of an op on a backend: the results' bytes, or the error it raised, and the kernels the
// emulator launched. On the emulated device, an input whose storage changed fails the test.
struct Outcome {
  Outputs specs;
  std::vector<std::vector<unsigned char>> results;
  std::string error;
  std::vector<std::string> kernels;
};

Outcome run_on(const std::string& backend, const std::string& name, const Inputs& inputs) {
  const OpDef& op = find_op(name);
  const bool emulated = backend == kEmulated;
  const Device device = emulated ? Device{DeviceType::cuda, 0} : Device{};
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
  set_backend_override("", backend);
  try {
    out.specs = infer_outputs(op, in);
    std::vector<TensorView> views;
    for (const auto& spec : out.specs) {
      int64_t n = 1;
      for (int64_t s : spec.shape) n *= s;
      out.results.emplace_back(size_t(n * dtype_size(spec.dtype)), 0xff);
      views.push_back(testing::view(place(out.results.back()), spec.dtype, spec.shape, {}, device));
    }
    run_kernel(op, select_kernel(op, in), in, views, emulated ? kCallerStream : nullptr);
    for (size_t i = 0; i < views.size(); ++i)
      if (!out.results[i].empty()) std::memcpy(out.results[i].data(), views[i].data, out.results[i].size());
  } catch (const Error& e) {
    out.error = e.what();
  }
  set_backend_override("", "");
  out.kernels = cuda_emu::take_launches();
  for (const auto& use : cuda_emu::take_stream_uses())  // all on the caller's stream, never another
    if (emulated && use.stream != kCallerStream)
      ADD_FAILURE() << name << ": " << use.what << " on stream " << use.stream << ", not the caller's";
  // The inputs' storage (gaps between strided elements too) is as it was: no stray writes.
  for (size_t i = 0, d = 0; emulated && i < inputs.tensors.size(); ++i)
    if (inputs.tensors[i] && std::memcmp(device_memory[d++], inputs.tensors[i]->bytes.data(), inputs.tensors[i]->bytes.size()))
      ADD_FAILURE() << name << ": input " << i << " changed on the device";
  for (void* p : device_memory) cuda_emu::release(p);
  return out;
}

// Allowed difference from the CPU kernel, relative to |cpu value| + the result's RMS (at least 1:
// the inputs are O(1), so a result's terms are too, and a cancellation leaves their rounding, as a
// layer norm of one element, 0 from terms of 1/sqrt(eps)). Both round each result once but sum in
// different orders (blocks, warps, tiles).
double tolerance(DType dtype) {
  switch (dtype) {
    case DType::float64: return 1e-10;
    case DType::float32: return 2e-4;
    case DType::float16: return 4e-3;
    case DType::bfloat16: return 3e-2;
    default: return 0;  // integers and quantized bytes: exact
  }
}

::testing::AssertionResult same_results(const std::string& what, const Outcome& cpu, const Outcome& gpu) {
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
// threads taking turns in reverse, which must give the same bits (opforge's CUDA kernels are
// deterministic, and a difference is a race). Returns the emulated kernels' names.
std::vector<std::string> check(const std::string& op, const Inputs& inputs, const std::string& what) {
  const size_t live = cuda_emu::live_allocations();
  const Outcome cpu = run_on("cpu", op, inputs);
  const Outcome gpu = run_on(kEmulated, op, inputs);
  EXPECT_TRUE(same_results(op + " " + what, cpu, gpu));
  cuda_emu::set_schedule(cuda_emu::Schedule::reverse);
  const Outcome reversed = run_on(kEmulated, op, inputs);
  cuda_emu::set_schedule(cuda_emu::Schedule::forward);
  EXPECT_EQ(reversed.error, gpu.error) << op << " " << what;
  EXPECT_TRUE(reversed.results == gpu.results)
      << op << " " << what << ": the results depend on the order the threads run in (a race), kernels "
      << ::testing::PrintToString(gpu.kernels);
  EXPECT_EQ(cuda_emu::live_allocations(), live) << op << " " << what << ": device memory left allocated";
  return gpu.kernels;
}

std::vector<DType> emulated_dtypes(const std::string& op) {
  for (const auto& k : kernels_of(op))
    if (k.backend == kEmulated) return k.dtypes;
  return {};
}

bool is_float(DType d) { return d == DType::float32 || d == DType::float64 || d == DType::float16 || d == DType::bfloat16; }

std::string shape_text(const std::vector<int64_t>& s) { return ::testing::PrintToString(s); }

// A case: inputs for (dtype, shape variant, layout); `shapes` variants are tried in every layout.
struct Case {
  int shapes;
  std::function<Inputs(DType, int, Layout, std::mt19937&)> inputs;
  std::function<bool(DType)> takes = [](DType) { return true; };
};

using Shape = std::vector<int64_t>;

const std::vector<Shape> kElementwise = {{0}, {1}, {7}, {3, 33}, {2, 3, 129}, {4100}};
const std::vector<std::pair<Shape, Shape>> kBroadcast = {
    {{5}, {5}}, {{3, 1}, {1, 4}}, {{2, 3, 33}, {33}}, {{4097}, {4097}}, {{0, 3}, {3}}, {{6, 1, 5}, {4, 1}},
    {{700, 3}, {3}}, {{3, 700}, {3, 1}}};  // the last two: long sums along and across the inner dimension
const std::vector<Shape> kRows = {{0, 8}, {1, 1}, {3, 33}, {5, 256}, {2, 3, 64}, {2, 4096}, {3, 8200}, {70, 40}};

Shape broadcast(Shape a, Shape b) {
  if (a.size() < b.size()) std::swap(a, b);
  for (size_t i = 0; i < b.size(); ++i) {
    int64_t& d = a[a.size() - b.size() + i];
    d = d == 1 ? b[i] : d;
  }
  return a;
}

Case unary(std::vector<AttrValue> attrs = {}) {
  return {int(kElementwise.size()), [attrs](DType d, int s, Layout l, std::mt19937& rng) {
            return Inputs{{make(d, kElementwise[s], l, rng)}, attrs};
          }};
}
// grad and one saved tensor of the same shape (relu_backward, silu_backward, ...).
Case unary_backward(int tensors, std::vector<AttrValue> attrs = {}) {
  return {int(kElementwise.size()), [tensors, attrs](DType d, int s, Layout l, std::mt19937& rng) {
            Inputs in{{}, attrs};
            for (int i = 0; i < tensors; ++i) in.tensors.push_back(make(d, kElementwise[s], l, rng));
            return in;
          }};
}
Case binary() {
  return {int(kBroadcast.size()), [](DType d, int s, Layout l, std::mt19937& rng) {
            return Inputs{{make(d, kBroadcast[s].first, l, rng), make(d, kBroadcast[s].second, l, rng)}, {}};
          }};
}
Case binary_backward() {
  return {int(kBroadcast.size()) * 3, [](DType d, int s, Layout l, std::mt19937& rng) {
            const auto& [x, y] = kBroadcast[s / 3];
            const int64_t mask = std::vector<int64_t>{-1, 1, 2}[s % 3];
            return Inputs{{make(d, broadcast(x, y), l, rng), make(d, x, l, rng), make(d, y, l, rng)}, {mask}};
          }};
}

Shape last(const Shape& s) { return {s.back()}; }

// The backward ops also get one tall shape, contiguous only (the fused kernels' layout): more rows
// than their chunks (row_chunks: 2048 at most), so chunks hold several rows in every dtype, and the
// column sums combine hundreds of chunks (eight loads ahead, then the rest).
const Shape kTallRows = {2500, 512};

Case norm(bool layer, bool backward) {
  const int variants = backward ? 3 : layer ? 2 : 1;  // output masks, or with and without a bias
  const int shapes = int(kRows.size()) * variants + (backward ? 1 : 0);
  return {shapes, [=](DType d, int s, Layout l, std::mt19937& rng) {
            const bool tall = s == int(kRows.size()) * variants;
            if (tall && l != Layout::contiguous) return Inputs{};  // skipped
            const Shape& shape = tall ? kTallRows : kRows[s / variants];
            const int v = tall ? 0 : s % variants;
            auto positive = [](std::mt19937& r) { return 0.5 + std::uniform_real_distribution<double>(0, 1)(r); };
            Inputs in;
            if (backward) in.tensors.push_back(make(d, shape, l, rng));
            in.tensors.push_back(make(d, shape, l, rng));
            in.tensors.push_back(make(d, last(shape), l, rng, positive));
            if (layer && !backward) in.tensors.push_back(v ? std::optional(make(d, last(shape), l, rng)) : std::nullopt);
            in.attrs.push_back(layer ? 1e-5 : 1e-6);
            if (backward) in.attrs.push_back(std::vector<int64_t>{-1, 1, layer ? 6 : 2}[v]);
            return in;
          }};
}

Case softmax(bool backward) {
  return {int(kRows.size()), [=](DType d, int s, Layout l, std::mt19937& rng) {
            Inputs in{{make(d, kRows[s], l, rng)}, {}};
            if (backward) in.tensors.push_back(make(d, kRows[s], l, rng));
            return in;
          }};
}

const char* const kActs[] = {"none", "relu", "gelu", "gelu_tanh", "silu"};
struct Product {
  Shape x;
  int64_t n;
};
const std::vector<Product> kProducts = {{{0, 4}, 3}, {{1, 1}, 1},      {{5, 3}, 7},     {{33, 65}, 17},
                                        {{2, 3, 40}, 9}, {{70, 130}, 66}, {{600, 8}, 5}};  // the last: grad_bias a long sum

Case linear(bool backward) {
  const int variants = 5 * 2;  // act x (bias or none)
  return {int(kProducts.size()) * variants, [=](DType d, int s, Layout l, std::mt19937& rng) {
            const Product& p = kProducts[s / variants];
            const char* act = kActs[s % variants / 2];
            const bool bias = s % 2 == 0;
            const int64_t k = p.x.back();
            const double scale = 1 / std::sqrt(double(std::max<int64_t>(k, 1)));
            auto scaled = [scale](std::mt19937& r) { return normal(r) * scale; };
            Shape out = p.x;
            out.back() = p.n;
            Inputs in;
            if (backward) in.tensors.push_back(make(d, out, l, rng));
            in.tensors.push_back(make(d, p.x, l, rng));
            in.tensors.push_back(make(d, {p.n, k}, l, rng, scaled));
            in.tensors.push_back(bias ? std::optional(make(d, {p.n}, l, rng)) : std::nullopt);
            if (backward)  // the saved pre-activation, or none (recomputed)
              in.tensors.push_back(s % 4 < 2 ? std::optional(make(d, out, l, rng)) : std::nullopt);
            in.attrs.push_back(std::string(act));
            if (backward) in.attrs.push_back(std::vector<int64_t>{-1, 1, 2, 4, 3}[s % 5]);
            return in;
          }};
}

Case rope(bool backward) {
  const std::vector<Shape> shapes = {{1, 1, 1, 2}, {2, 5, 3, 8}, {1, 7, 2, 66}, {3, 4, 1, 128}, {0, 4, 2, 8}};
  return {int(shapes.size()) * 2, [=](DType d, int s, Layout l, std::mt19937& rng) {
            const Shape& x = shapes[s / 2];
            const Shape table = {x[x.size() - 3], x.back() / 2};
            auto angle_cos = [](std::mt19937& r) { return std::cos(std::uniform_real_distribution<double>(0, 6.3)(r)); };
            return Inputs{{make(d, x, l, rng), make(d, table, l, rng, angle_cos), make(d, table, l, rng, angle_cos)},
                          {bool(s % 2)}};
          }};
  (void)backward;
}

Case scatter(bool backward) {
  struct S {
    Shape src;
    int64_t dim, dim_size;
  };
  const std::vector<S> shapes = {{{0, 3}, 0, 4}, {{9, 5}, 0, 16}, {{40, 33}, 0, 3}, {{3, 50, 2}, 1, 7}, {{7}, 0, 1}};
  return {int(shapes.size()) * 2, [=](DType d, int s, Layout l, std::mt19937& rng) {
            const S& c = shapes[s / 2];
            const DType index_dtype = s % 2 ? DType::int32 : DType::int64;
            const int64_t n = c.src[c.dim];
            auto bucket = [&c](std::mt19937& r) { return double(r() % c.dim_size); };
            HostTensor index = make(index_dtype, {n}, l == Layout::strided ? l : Layout::contiguous, rng, bucket);
            if (!backward) return Inputs{{make(d, c.src, l, rng), index}, {c.dim_size, c.dim}};
            Shape grad = c.src;
            grad[c.dim] = c.dim_size;
            return Inputs{{make(d, grad, l, rng), index}, {c.dim}};
          }};
}

// Values of x spread over orders of magnitude per 32-block, as quantize_q8_0's sample does.
double spread(std::mt19937& rng) { return normal(rng) * std::pow(10.0, std::uniform_int_distribution<int>(-3, 3)(rng)); }

const std::vector<Shape> kQuantRows = {{0, 32}, {1, 32}, {3, 64}, {5, 160}, {2, 3, 96}};

Case quantize() {
  return {int(kQuantRows.size()), [](DType d, int s, Layout l, std::mt19937& rng) {
            return Inputs{{make(d, kQuantRows[s], l, rng, spread)}, {}};
          }};
}

// Quantized bytes of random rows, by the CPU quantizer: packed, one byte in (misaligned), or with
// rows three bytes apart (strided).
HostTensor quantized(const std::string& format, Shape rows, std::mt19937& rng, Layout layout = Layout::contiguous) {
  const HostTensor x = make(DType::float32, rows, Layout::contiguous, rng);
  const Outcome q = run_on("cpu", "quantize_" + format, {{x}, {}});
  EXPECT_EQ(q.error, "");
  const Shape shape = q.specs[0].shape;
  HostTensor t{DType::uint8, shape, contiguous_strides(shape)};
  const int64_t row = shape.back(), count = int64_t(q.results[0].size()) / std::max<int64_t>(row, 1);
  const int64_t pitch = layout == Layout::strided ? row + 3 : row;
  t.offset = layout == Layout::misaligned ? 1 : 0;
  if (layout == Layout::strided)
    for (size_t d = 0; d + 1 < shape.size(); ++d) t.strides[d] = t.strides[d] / row * pitch;
  t.bytes.assign(size_t(t.offset + count * pitch + 1), 0xee);
  for (int64_t r = 0; r < count; ++r)
    std::memcpy(t.bytes.data() + t.offset + r * pitch, q.results[0].data() + r * row, size_t(row));
  return t;
}

Case dequantize() {
  return {int(kQuantRows.size()) * 2, [](DType, int s, Layout l, std::mt19937& rng) {
            const std::string format = s % 2 ? "q4_0" : "q8_0";
            return Inputs{{quantized(format, kQuantRows[s / 2], rng, l)}, {format}};
          }};
}

Case matmul_q() {
  const std::vector<Product> shapes = {{{0, 32}, 3}, {{1, 32}, 1}, {{5, 64}, 7}, {{9, 96}, 33}, {{2, 3, 64}, 5}};
  return {int(shapes.size()) * 2, [=](DType d, int s, Layout l, std::mt19937& rng) {
            const Product& p = shapes[s / 2];
            const std::string format = s % 2 ? "q4_0" : "q8_0";
            return Inputs{{make(d, p.x, l, rng), quantized(format, {p.n, p.x.back()}, rng)}, {format}};
          }};
}

const std::map<std::string, Case>& cases() {
  static const std::map<std::string, Case> table = {
      {"add", binary()},
      {"mul", binary()},
      {"add_one", unary()},
      {"relu", unary()},
      {"silu", unary()},
      {"gelu", {int(kElementwise.size()) * 2, [](DType d, int s, Layout l, std::mt19937& rng) {
                  return Inputs{{make(d, kElementwise[s / 2], l, rng)}, {std::string(s % 2 ? "tanh" : "none")}};
                }}},
      {"add_one_backward", unary_backward(1)},
      {"relu_backward", unary_backward(2)},
      {"silu_backward", unary_backward(2)},
      {"gelu_backward", {int(kElementwise.size()) * 2, [](DType d, int s, Layout l, std::mt19937& rng) {
                           return Inputs{{make(d, kElementwise[s / 2], l, rng), make(d, kElementwise[s / 2], l, rng)},
                                         {std::string(s % 2 ? "tanh" : "none")}};
                         }}},
      {"add_backward", binary_backward()},
      {"mul_backward", binary_backward()},
      {"rms_norm", norm(false, false)},
      {"layer_norm", norm(true, false)},
      {"rms_norm_backward", norm(false, true)},
      {"layer_norm_backward", norm(true, true)},
      {"softmax", softmax(false)},
      {"softmax_backward", softmax(true)},
      {"linear_act", linear(false)},
      {"linear_act_with_preact", linear(false)},
      {"linear_act_backward", linear(true)},
      {"rope", rope(false)},
      {"rope_backward", rope(true)},
      {"scatter_add", scatter(false)},
      {"scatter_add_backward", scatter(true)},
      {"quantize_q8_0", quantize()},
      {"quantize_q4_0", quantize()},
      {"dequantize", dequantize()},
      {"matmul_q", matmul_q()},
  };
  return table;
}

std::vector<std::string> emulated_ops() {
  std::vector<std::string> names;
  for (const OpDef* op : all_ops())
    if (!emulated_dtypes(op->name()).empty()) names.push_back(op->name());
  return names;
}

TEST(CudaEmulated, EveryCudaKernelHasACase) {
  const auto names = emulated_ops();
  EXPECT_GE(names.size(), 25u);  // the emulated kernels registered at all
  for (const auto& name : names) EXPECT_TRUE(cases().count(name)) << name << " has a CUDA kernel but no case here";
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
          const Inputs in = c.inputs(dtype, s, layout, rng);
          if (in.tensors.empty()) continue;  // the case has no such layout
          std::string what = std::string(dtype_name(dtype)) + " " + layout_name(layout) + " case " +
                             std::to_string(s) + (blaslt ? " (cuBLASLt)" : "");
          for (const auto& t : in.tensors) what += " " + (t ? shape_text(t->shape) : std::string("None"));
          for (const auto& k : check(op, in, what)) kernels.insert(k);
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

// Which kernel a layout reaches: the packed and cached paths for contiguous aligned rows, the
// general ones otherwise, the fused backward while rows fit.
TEST(CudaEmulated, LayoutsPickTheirKernels) {
  std::mt19937 rng(7);
  auto kernels_for = [&](const std::string& op, const Inputs& in) {
    std::string all;
    for (const auto& k : check(op, in, "path")) all += k + " ";
    return all;
  };
  const Inputs rows{{make(DType::float32, {4, 256}, Layout::contiguous, rng), make(DType::float32, {256}, Layout::contiguous, rng)}, {1e-6}};
  EXPECT_NE(kernels_for("rms_norm", rows).find("cached_kernel"), std::string::npos);
  const Inputs odd{{make(DType::float32, {4, 256}, Layout::misaligned, rng), make(DType::float32, {256}, Layout::contiguous, rng)}, {1e-6}};
  EXPECT_NE(kernels_for("rms_norm", odd).find("strided_kernel"), std::string::npos);
  const Inputs back{{make(DType::float32, {300, 64}, Layout::contiguous, rng), make(DType::float32, {300, 64}, Layout::contiguous, rng),
                     make(DType::float32, {64}, Layout::contiguous, rng)}, {1e-6, int64_t{-1}}};
  EXPECT_NE(kernels_for("rms_norm_backward", back).find("fused_kernel"), std::string::npos);
  const Inputs flat{{make(DType::float16, {4100}, Layout::contiguous, rng)}, {}};
  EXPECT_NE(kernels_for("relu", flat).find("map_contiguous"), std::string::npos);
}

// An index value out of range is found on the device (read_kernel's atomicMin, copied back) and
// raised before any result is written, with the CPU kernel's words: the op, the value, its position.
TEST(CudaEmulated, AnIndexOutOfRangeIsFoundOnTheDevice) {
  std::mt19937 rng(11);
  for (DType index_dtype : {DType::int32, DType::int64}) {
    HostTensor index = make(index_dtype, {6}, Layout::contiguous, rng, [](std::mt19937& r) { return double(r() % 7); });
    from_double(index.bytes.data() + 3 * dtype_size(index_dtype), index_dtype, 7);
    from_double(index.bytes.data() + 5 * dtype_size(index_dtype), index_dtype, -1);
    const Inputs forward{{make(DType::float32, {6, 4}, Layout::contiguous, rng), index}, {int64_t{7}, int64_t{0}}};
    const Inputs backward{{make(DType::float32, {7, 4}, Layout::contiguous, rng), index}, {int64_t{0}}};
    for (const auto& [op, in] : {std::pair{"scatter_add", forward}, std::pair{"scatter_add_backward", backward}}) {
      const Outcome cpu = run_on("cpu", op, in), gpu = run_on(kEmulated, op, in);
      EXPECT_NE(gpu.error.find("got 7 at position 3"), std::string::npos) << op << ": " << gpu.error;
      EXPECT_EQ(gpu.error, cpu.error) << op;
    }
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
  EXPECT_NE(failed.error.find("scatter_add(): cudaMallocAsync failed: out of memory"), std::string::npos)
      << failed.error;
  const Outcome next = run_on(kEmulated, "add_one", {{make(DType::float32, {8}, Layout::contiguous, rng)}, {}});
  EXPECT_EQ(next.error, "");
}

}  // namespace
}  // namespace opforge
