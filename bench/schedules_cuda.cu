// opforge's memory-bound CUDA kernels timed under other schedules of the same code beside the
// ops' own, on one GPU, against the device-to-device copy, so that the next change of schedule is
// a measured one:
// - the norms' one-row-per-block kernels (ops/rms_norm/rms_norm.cuh, ops/layer_norm/layer_norm.cuh),
//   over other row types (the norms' contiguous_kernel<T, Row>):
//   - cuda::CachedRow, the row in registers: packs per thread (2, 4 = the ops' own, 8, 16; fewer
//     threads per row, more registers each), stores the compiler may not hoist the next pack's
//     weight loads above (fewer registers: float32 layer_norm 52 -> 40), streaming (evict-first)
//     loads and stores;
//   - cuda::ColumnsFirstRow, CachedRow with every weight/bias pack of a thread loaded before its
//     first store (the op's own alternates loads and stores: a round trip to L1 per pack after
//     the reduction, in PTX; ptxas: float32 rms_norm 59 registers at 4 packs, 39 at 2);
//   - cuda::StagedRow, the row staged in shared memory by cp.async (an SM holds as many rows as
//     its shared memory does, not as its registers do);
//   - cuda::RereadRow, the row read again from the caches on every pass, as inductor's looped
//     reductions do at 4096 columns (few registers; an SM holds as many rows as it has threads
//     for), with and without inductor's evict-last / evict-first hints, and those loads fenced (the
//     first variants) or not, without per-pack bounds tests on rows the block covers exactly (as
//     Triton's unmasked loads at 4096 columns);
//   - the op's own row in a kernel of its own whose __launch_bounds__ caps registers at 32 (512
//     threads x 4 blocks: 8 blocks of the op's 256 threads per SM, every warp slot), as
//     torch.compile's kernels run (ncu at 794c939: 24 registers and 92% of warps active against the
//     op's 40 and 71%, rms_norm 123.5 against 126.7 us; layer_norm's 52 registers, 48%);
// - the elementwise kernel (cuda::map_contiguous, with silu's functor and as a plain copy): packs
//   per thread, a thread's packs a grid apart (the ops' own) or each block's packs one contiguous
//   tile (as Triton lays out inductor's pointwise kernels), block size, streaming loads and stores.
// - scatter_add's summing kernel (ops/scatter_add/scatter_add.cuh; 16384 rows into 16 buckets of
//   4096 columns: 65536 outputs, each the in-order sum of its bucket's 1024 rows): source rows loaded
//   ahead of the adds (16, 32, 64), threads per block, and 2 or 4 adjacent outputs per thread
//   read as one vector (fewer, wider loads; a block reads longer runs of each row); the op's own
//   since 2026-11-27 are 2 columns, 128 threads, 32 ahead where the layout allows (this one's),
//   1 column, 256 threads, 32 ahead (16 for 2-byte elements) elsewhere; the sort and the index
//   check around it are not timed here;
// - matmul_q for one token (ops/matmul_q/matmul_q.cuh): one launch, the gemv quantizing the row
//   itself (the op's way since 6e5da0d), and two, x quantized into a workspace first; each also
//   with gemv_kernel's kLaneSums (added 2026-11-28, untimed): a run's terms summed in block
//   order by one lane per row from shared memory instead of by every lane through 32 shuffles
//   (ncu had the op's gemv at 61% of the SMs' throughput and 13-23% of HBM's); and 8 rows (the
//   gemv's most), two launches, either way of summing.
// The H200 run at db57f81 had the norms at 95-97% of the copy, 0.95-0.96x torch.compile's kernels,
// silu/relu at 97-98%, 0.97-0.98x, scatter_add at 28% (the whole op), 0.58x, and a token's
// matmul_q at 25.6 us in either format. This lab's first run (H200, 794c939,
// bench/results/schedules_cuda.md): no norm or elementwise schedule ahead of the ops' own beyond
// the ~2% noise between identical schedules; scatter_add's two columns 1.18x (float32) and 2.65x
// (bfloat16), adopted; matmul_q's one launch 1.14-1.22x two, kept. Each
// schedule's blocks per SM (registers decide it for CachedRow: a row's bytes in flight live in
// them), registers and local memory per thread are printed beside its time.
//
// Built and run by scripts/gpu_check.sh (step schedules), or by hand from the repository root:
//   nvcc -O3 -std=c++20 -arch=native -Iinclude -I. bench/schedules_cuda.cu -o build/schedules_cuda
//   build/schedules_cuda [out.csv] [rows] [cols] [repeats]
// Timing: CUDA events around each launch, the schedules interleaved call by call, inputs rotated
// past three times the L2, median of 30 calls. Every schedule's output is compared with the ops'
// own on the same input (the norms' sums are added in another order: float rounding apart; the
// elementwise results must be equal); a mismatch fails the run.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "opforge/cuda/activation.cuh"
#include "opforge/cuda/schedule_variants.cuh"
#include "ops/layer_norm/layer_norm.cuh"
#include "ops/matmul_q/matmul_q.cuh"
#include "ops/rms_norm/rms_norm.cuh"
#include "ops/scatter_add/scatter_add.cuh"

namespace {

using namespace opforge;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "schedules_cuda: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

// x[i] uniform in [-2, 2) from a hash of i and a seed: fresh values without a host copy of 256 MiB.
template <typename T>
__global__ void fill(T* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B9u ^ seed;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    x[i] = static_cast<T>(static_cast<float>(h >> 8) * (4.0f / 16777216.0f) - 2.0f);
  }
}

template <typename T>
T* device_array(int64_t n, uint32_t seed) {
  T* p = nullptr;
  check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
  fill<<<static_cast<unsigned>(std::min<int64_t>(1024, (n + 255) / 256 + 1)), 256>>>(p, n, seed);
  check(cudaGetLastError(), "fill");
  return p;
}

template <typename T>
struct Buffers {
  int64_t rows, n;
  std::vector<T*> x, out;  // rotated: x[s] -> out[s]
  T *w, *b;
};

// One schedule of one op: its launch, its kernel (for registers and occupancy), its block size
// (0: it cannot run this shape), the bytes a call moves.
template <typename T>
struct Schedule {
  std::string op, label;
  const void* kernel;
  int threads;
  double bytes;
  void (*launch)(const Buffers<T>&, int set, cudaStream_t);
};

template <typename T, class Row>
void launch_rms_norm(const Buffers<T>& b, int s, cudaStream_t stream) {
  rms_norm_cuda::contiguous_kernel<T, Row><<<cuda::row_blocks(b.rows), cuda::contiguous_row_threads<Row>(b.n), 0,
                                             stream>>>(b.out[s], b.x[s], b.w, 1, b.rows, b.n, 1e-6);
}

template <typename T, class Row>
void launch_layer_norm(const Buffers<T>& b, int s, cudaStream_t stream) {
  layer_norm_cuda::contiguous_kernel<T, Row><<<cuda::row_blocks(b.rows), cuda::contiguous_row_threads<Row>(b.n), 0,
                                               stream>>>(b.out[s], b.x[s], b.w, 1, b.b, 1, b.rows, b.n, 1e-5);
}

// The norms' contiguous kernels with registers capped at 32 a thread (see the header).
template <typename T, class Row>
__global__ void __launch_bounds__(cuda::kMaxRowThreads, 4)
    capped_rms_norm(T* out, const T* x, const T* w, int64_t rows, int64_t n, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    rms_norm_cuda::normalize(out + r * n, Row(x + r * n, n), w, 1, n, eps);
}

template <typename T, class Row>
__global__ void __launch_bounds__(cuda::kMaxRowThreads, 4)
    capped_layer_norm(T* out, const T* x, const T* w, const T* b, int64_t rows, int64_t n, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    layer_norm_cuda::normalize(out + r * n, Row(x + r * n, n), x + r * n, w, 1, b, 1, n, eps);
}

template <typename T, class Row>
void launch_capped_rms_norm(const Buffers<T>& b, int s, cudaStream_t stream) {
  capped_rms_norm<T, Row><<<cuda::row_blocks(b.rows), cuda::contiguous_row_threads<Row>(b.n), 0, stream>>>(
      b.out[s], b.x[s], b.w, b.rows, b.n, 1e-6);
}

template <typename T, class Row>
void launch_capped_layer_norm(const Buffers<T>& b, int s, cudaStream_t stream) {
  capped_layer_norm<T, Row><<<cuda::row_blocks(b.rows), cuda::contiguous_row_threads<Row>(b.n), 0, stream>>>(
      b.out[s], b.x[s], b.w, b.b, b.rows, b.n, 1e-5);
}

// y = x, through map_contiguous: the elementwise kernel's own cost beside the driver's copy.
struct Copy {
  template <typename A> __device__ A operator()(A x) const { return x; }
};

template <typename T, class F, class S>
void launch_map(const Buffers<T>& b, int s, cudaStream_t stream) {
  cuda::Operands<T, 1> in{{b.x[s]}};
  in.narrow = b.rows * b.n / cuda::Pack<T>::kSize <= UINT32_MAX;
  cuda::launch_map_contiguous<T, 1, F, S>(b.out[s], in, b.rows * b.n, F{}, stream);
}

std::string access_name(cuda::PlainAccess) { return "plain"; }
std::string access_name(cuda::OrderedAccess) { return "ordered stores"; }
std::string access_name(cuda::StreamingAccess) { return "streaming"; }

// A row schedule's label: its packs per thread and how it holds and moves them.
template <typename T, int kPacks, class Access>
std::string row_label(std::type_identity<cuda::CachedRow<T, kPacks, Access>>) {
  return std::to_string(kPacks) + " packs " + access_name(Access{});
}
template <typename T, int kPacks>
std::string row_label(std::type_identity<cuda::ColumnsFirstRow<T, kPacks>>) {
  return std::to_string(kPacks) + " packs plain, weights loaded before the stores";
}
template <typename T, int kPacks>
std::string row_label(std::type_identity<cuda::StagedRow<T, kPacks>>) {
  return std::to_string(kPacks) + " packs staged in shared memory";
}
template <typename T, int kPacks, int kGroup, bool kHinted, bool kFenced>
std::string row_label(std::type_identity<cuda::RereadRow<T, kPacks, kGroup, kHinted, kFenced>>) {
  return std::to_string(kPacks) + " packs reread per pass, " + std::to_string(kGroup) + " at a time" +
         (kHinted ? (kFenced ? ", evict-last/first" : ", evict-last/first unfenced") : "");
}

template <typename T, class Row>
void add_rms_norm(std::vector<Schedule<T>>& list, int64_t rows, int64_t n, const char* own = "") {
  list.push_back({"rms_norm", row_label(std::type_identity<Row>{}) + own,
                  reinterpret_cast<const void*>(rms_norm_cuda::contiguous_kernel<T, Row>),
                  cuda::contiguous_row_threads<Row>(n), (2.0 * rows * n + n) * sizeof(T), launch_rms_norm<T, Row>});
}

template <typename T, class Row>
void add_layer_norm(std::vector<Schedule<T>>& list, int64_t rows, int64_t n, const char* own = "") {
  list.push_back({"layer_norm", row_label(std::type_identity<Row>{}) + own,
                  reinterpret_cast<const void*>(layer_norm_cuda::contiguous_kernel<T, Row>),
                  cuda::contiguous_row_threads<Row>(n), (2.0 * rows * n + 2.0 * n) * sizeof(T),
                  launch_layer_norm<T, Row>});
}

template <typename T, class Row>
void add_norms(std::vector<Schedule<T>>& list, int64_t rows, int64_t n) {
  add_rms_norm<T, Row>(list, rows, n);
  add_layer_norm<T, Row>(list, rows, n);
}

// The op's own rows (OwnRow) in the kernels capped at 32 registers.
template <typename T>
void add_capped_norms(std::vector<Schedule<T>>& list, int64_t rows, int64_t n) {
  using RmsRow = rms_norm_cuda::OwnRow<T>;
  using LayerRow = layer_norm_cuda::OwnRow<T>;
  const std::string capped = ", registers capped at 32";
  list.push_back({"rms_norm", row_label(std::type_identity<RmsRow>{}) + capped,
                  reinterpret_cast<const void*>(capped_rms_norm<T, RmsRow>), cuda::contiguous_row_threads<RmsRow>(n),
                  (2.0 * rows * n + n) * sizeof(T), launch_capped_rms_norm<T, RmsRow>});
  list.push_back({"layer_norm", row_label(std::type_identity<LayerRow>{}) + capped,
                  reinterpret_cast<const void*>(capped_layer_norm<T, LayerRow>),
                  cuda::contiguous_row_threads<LayerRow>(n), (2.0 * rows * n + 2.0 * n) * sizeof(T),
                  launch_capped_layer_norm<T, LayerRow>});
}

template <typename T, class S>
void add_map(std::vector<Schedule<T>>& list, int64_t rows, int64_t n, const char* own = "") {
  const std::string label = std::to_string(S::kPacks) + " packs " + (S::kTiled ? "tiled" : "a grid apart") + ", " +
                            std::to_string(S::kThreads) + " threads, " + access_name(typename S::Access{}) + own;
  list.push_back({"silu", label, reinterpret_cast<const void*>(cuda::map_contiguous<T, 1, cuda::Silu, S>), S::kThreads,
                  2.0 * rows * n * sizeof(T), launch_map<T, cuda::Silu, S>});
  list.push_back({"copy", label, reinterpret_cast<const void*>(cuda::map_contiguous<T, 1, Copy, S>), S::kThreads,
                  2.0 * rows * n * sizeof(T), launch_map<T, Copy, S>});
}

// Each op's own schedule first: the others of that op are compared with it. The own schedule is
// also among the others, timed as an entry of its own: its ratio to itself is the noise.
template <typename T>
std::vector<Schedule<T>> schedules(int64_t rows, int64_t n) {
  using cuda::MapSchedule, cuda::OrderedAccess, cuda::PlainAccess, cuda::StreamingAccess;
  std::vector<Schedule<T>> list;
  using cuda::CachedRow, cuda::ColumnsFirstRow, cuda::RereadRow, cuda::StagedRow;
  add_rms_norm<T, rms_norm_cuda::OwnRow<T>>(list, rows, n, " (the op's)");
  add_layer_norm<T, layer_norm_cuda::OwnRow<T>>(list, rows, n, " (the op's)");
  add_norms<T, CachedRow<T, 2, PlainAccess>>(list, rows, n);
  add_norms<T, CachedRow<T, 4, PlainAccess>>(list, rows, n);
  add_norms<T, CachedRow<T, 8, PlainAccess>>(list, rows, n);
  add_norms<T, CachedRow<T, 16, PlainAccess>>(list, rows, n);
  add_norms<T, CachedRow<T, 4, OrderedAccess>>(list, rows, n);
  add_norms<T, CachedRow<T, 8, OrderedAccess>>(list, rows, n);
  add_norms<T, CachedRow<T, 4, StreamingAccess>>(list, rows, n);
  add_norms<T, CachedRow<T, 8, StreamingAccess>>(list, rows, n);
  add_norms<T, ColumnsFirstRow<T, 4>>(list, rows, n);
  add_norms<T, ColumnsFirstRow<T, 2>>(list, rows, n);
  add_capped_norms<T>(list, rows, n);
  add_norms<T, StagedRow<T, 4>>(list, rows, n);
  add_norms<T, StagedRow<T, 8>>(list, rows, n);
  add_norms<T, RereadRow<T, 4, 2>>(list, rows, n);
  add_norms<T, RereadRow<T, 4, 2, false>>(list, rows, n);
  add_norms<T, RereadRow<T, 4, 1>>(list, rows, n);
  add_norms<T, RereadRow<T, 2, 1>>(list, rows, n);  // inductor's shape at 4096 float32 columns (ncu)
  add_norms<T, RereadRow<T, 2, 2>>(list, rows, n);  // the same, a thread's two packs in flight at once
  // As Triton's loads are: no volatile, no memory clobber (load_with_eviction).
  add_norms<T, RereadRow<T, 2, 1, true, false>>(list, rows, n);
  add_norms<T, RereadRow<T, 2, 2, true, false>>(list, rows, n);
  add_norms<T, RereadRow<T, 4, 2, true, false>>(list, rows, n);
  add_norms<T, RereadRow<T, 8, 2>>(list, rows, n);
  add_map<T, MapSchedule<>>(list, rows, n, " (the ops')");
  add_map<T, MapSchedule<2, false, PlainAccess, 256>>(list, rows, n);
  add_map<T, MapSchedule<4, false, PlainAccess, 256>>(list, rows, n);
  add_map<T, MapSchedule<8, false, PlainAccess, 256>>(list, rows, n);
  add_map<T, MapSchedule<4, true, PlainAccess, 256>>(list, rows, n);
  add_map<T, MapSchedule<2, true, PlainAccess, 128>>(list, rows, n);
  add_map<T, MapSchedule<4, false, PlainAccess, 128>>(list, rows, n);
  add_map<T, MapSchedule<4, false, StreamingAccess, 256>>(list, rows, n);
  add_map<T, MapSchedule<4, true, StreamingAccess, 256>>(list, rows, n);
  return list;
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// result[0] = max |got - want| (a NaN difference counts as infinite), result[1] = max |want|, as
// the bits of non-negative floats (which order as their bits do); result zeroed before.
template <typename T>
__global__ void max_difference(const T* got, const T* want, int64_t n, unsigned* result) {
  float worst = 0.0f, scale = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = static_cast<float>(got[i]), w = static_cast<float>(want[i]), d = fabsf(g - w);
    worst = d <= 3.0e38f ? fmaxf(worst, d) : 3.4e38f;
    scale = fmaxf(scale, fabsf(w));
  }
  atomicMax(result, __float_as_uint(worst));
  atomicMax(result + 1, __float_as_uint(scale));
}

// {max |got - want|, max |want|} over n elements on the device (a 256 MiB output copied to the host
// and compared there took about 0.3 s; there are a hundred).
template <typename T>
std::pair<float, float> max_difference(const T* got, const T* want, int64_t n, cudaStream_t stream) {
  unsigned* result = nullptr;
  check(cudaMalloc(&result, 2 * sizeof(unsigned)), "cudaMalloc");
  check(cudaMemsetAsync(result, 0, 2 * sizeof(unsigned), stream), "memset");
  max_difference<<<static_cast<unsigned>(std::min<int64_t>(1024, (n + 255) / 256 + 1)), 256, 0, stream>>>(got, want, n,
                                                                                                          result);
  check(cudaGetLastError(), "max_difference");
  unsigned bits[2];
  check(cudaMemcpyAsync(bits, result, sizeof(bits), cudaMemcpyDeviceToHost, stream), "copy back");
  check(cudaStreamSynchronize(stream), "max_difference");
  cudaFree(result);
  return {std::bit_cast<float>(bits[0]), std::bit_cast<float>(bits[1])};
}

template <typename T>
std::vector<float> to_host(const T* p, int64_t n) {
  std::vector<T> raw(n);
  check(cudaMemcpy(raw.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "copy back");
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(raw[i]);
  return out;
}

// The median time (us) of each launch (null: not run, 0), the launches interleaved call by call
// (launch(s) runs on input set s; each call takes the next set), after two rounds of
// warm-up: drift in the machine's speed lands on every schedule alike, and the round's first
// launch (after the wait for the last round) is a different one each round.
std::vector<float> median_times(const std::vector<std::function<void(int)>>& launches, int sets, int repeats,
                                cudaStream_t stream) {
  const size_t count = launches.size();
  std::vector<std::vector<float>> times(count);
  std::vector<cudaEvent_t> starts(count), ends(count);
  for (size_t i = 0; i < count; ++i) {
    check(cudaEventCreate(&starts[i]), "event");
    check(cudaEventCreate(&ends[i]), "event");
  }
  int64_t calls = 0;  // consecutive calls take consecutive input sets
  for (int r = -2; r < repeats; ++r) {
    for (size_t j = 0; j < count; ++j) {
      const size_t i = (j + size_t(r + 2)) % count;  // each round starts one further on: no launch always first
      if (!launches[i]) continue;
      check(cudaEventRecord(starts[i], stream), "record");
      launches[i](int(calls++ % sets));
      check(cudaGetLastError(), "a timed launch");
      check(cudaEventRecord(ends[i], stream), "record");
    }
    check(cudaStreamSynchronize(stream), "timed launches");
    for (size_t i = 0; r >= 0 && i < count; ++i) {
      if (!launches[i]) continue;
      float ms = 0;
      check(cudaEventElapsedTime(&ms, starts[i], ends[i]), "elapsed");
      times[i].push_back(ms * 1e3f);
    }
  }
  std::vector<float> medians(count, 0.0f);
  for (size_t i = 0; i < count; ++i) {
    if (!times[i].empty()) medians[i] = median(times[i]);
    cudaEventDestroy(starts[i]);
    cudaEventDestroy(ends[i]);
  }
  return medians;
}

struct Row {
  std::string op, dtype, schedule;
  int threads, regs, local_bytes, blocks_per_sm;
  float us, gbps, pct_copy, vs_own, max_diff;
};

// Times every schedule on rows x n of T; returns false if an output differs from its op's own.
template <typename T>
bool run(const char* dtype, int64_t rows, int64_t n, int sets, float copy_gbps, int repeats, std::vector<Row>& table) {
  Buffers<T> b{rows, n, {}, {}, nullptr, nullptr};
  for (int s = 0; s < sets; ++s) {
    b.x.push_back(device_array<T>(rows * n, 11 + s));
    b.out.push_back(device_array<T>(rows * n, 0));
  }
  b.w = device_array<T>(n, 7);
  b.b = device_array<T>(n, 8);
  check(cudaDeviceSynchronize(), "fill");  // the fills ran on the legacy stream, the schedules will not
  const std::vector<Schedule<T>> list = schedules<T>(rows, n);
  std::map<std::string, size_t> own;  // op -> its own schedule's place in the list
  for (size_t i = 0; i < list.size(); ++i) own.emplace(list[i].op, i);
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");

  // Outputs first: each schedule on set 0, compared with its op's own (its output kept in want[op]).
  bool ok = true;
  std::vector<float> diffs(list.size(), 0.0f);
  std::map<std::string, T*> want;
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].threads) continue;
    list[i].launch(b, 0, stream);
    check(cudaGetLastError(), list[i].label.c_str());
    if (own[list[i].op] == i) {
      check(cudaMalloc(&want[list[i].op], rows * n * sizeof(T)), "cudaMalloc");
      check(cudaMemcpyAsync(want[list[i].op], b.out[0], rows * n * sizeof(T), cudaMemcpyDeviceToDevice, stream),
            "copy");
    }
    const auto [worst, scale] = max_difference(b.out[0], want[list[i].op], rows * n, stream);
    diffs[i] = worst;
    const bool exact = list[i].op == "silu" || list[i].op == "copy";  // the same function of the same value
    const float tolerance = exact ? 0.0f : (sizeof(T) == 4 ? 1e-5f : 2e-2f) * scale;
    if (!(worst <= tolerance)) {
      std::fprintf(stderr, "schedules_cuda: %s %s %s differs from the op's own by %g (tolerance %g)\n",
                   list[i].op.c_str(), dtype, list[i].label.c_str(), worst, tolerance);
      ok = false;
    }
  }
  for (auto& [op, p] : want) cudaFree(p);

  std::vector<std::function<void(int)>> launches;
  for (const Schedule<T>& sc : list)
    launches.push_back(sc.threads ? std::function<void(int)>([&b, &sc, stream](int s) { sc.launch(b, s, stream); })
                                  : std::function<void(int)>());
  const std::vector<float> us_of = median_times(launches, sets, repeats, stream);

  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].threads) continue;
    cudaFuncAttributes attr{};
    check(cudaFuncGetAttributes(&attr, list[i].kernel), "attributes");
    int blocks = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, list[i].kernel, list[i].threads, 0), "occupancy");
    const float us = us_of[i];
    const float gbps = static_cast<float>(list[i].bytes / (us * 1e3));
    table.push_back({list[i].op, dtype, list[i].label, list[i].threads, attr.numRegs,
                     static_cast<int>(attr.localSizeBytes), blocks, us, gbps, 100.0f * gbps / copy_gbps,
                     us_of[own[list[i].op]] / us, diffs[i]});
  }
  for (int s = 0; s < sets; ++s) {
    cudaFree(b.x[s]);
    cudaFree(b.out[s]);
  }
  cudaFree(b.w);
  cudaFree(b.b);
  cudaStreamDestroy(stream);
  return ok;
}

// matmul_q's gemv for m <= kGemvRows rows (m x k activations, n x k weights in format F, float32):
// for one token in one launch, the gemv quantizing x itself (the op's way where
// matmul_q_cuda::fuses_row), and in two, x quantized into a workspace first (the op's way for more
// rows); each with the op's shuffled sums and with kLaneSums. All must give the same bits (the
// CPU's). Weights rotated past three times the L2 (10-20 MB each at k = n = 4096). Returns false
// if the outputs differ.
template <quant::Format F>
bool run_matmul_q(int64_t m, int64_t n, int64_t k, int64_t l2_bytes, float copy_gbps, int repeats,
                  std::vector<Row>& table) {
  namespace mq = matmul_q_cuda;
  const int64_t nb = k / quant::kBlock, w_bytes = n * nb * quant::block_bytes(F);
  // Random quants, scales of 1e-3 to 1e-1 (fp16), on the host once, then copies on the device.
  std::vector<uint8_t> host(w_bytes);
  std::mt19937 gen(5);
  for (uint8_t& byte : host) byte = static_cast<uint8_t>(gen());
  std::uniform_real_distribution<float> scale(1e-3f, 1e-1f);
  for (int64_t blk = 0; blk < n * nb; ++blk) {
    const __half d = __float2half(scale(gen));
    std::memcpy(&host[blk * quant::block_bytes(F)], &d, 2);
  }
  const int sets = static_cast<int>(std::max<int64_t>(2, 3 * l2_bytes / w_bytes + 1));
  std::vector<uint8_t*> w(sets);
  for (uint8_t*& p : w) {
    check(cudaMalloc(&p, w_bytes), "cudaMalloc");
    check(cudaMemcpy(p, host.data(), w_bytes, cudaMemcpyHostToDevice), "weights");
  }
  float* x = device_array<float>(m * k, 3);
  float *y = nullptr, *workspace = nullptr;
  check(cudaMalloc(&y, m * n * sizeof(float)), "cudaMalloc");
  check(cudaMalloc(&workspace, mq::quantized_x_bytes(m * nb)), "cudaMalloc");
  check(cudaDeviceSynchronize(), "fill");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cuda::BlockWalk walk;
  walk.nb = nb;
  walk.packed = cuda::aligned16(x);
  const mq::QuantizedX xq = mq::quantized_x_at(workspace, m * nb);
  const bool own_fused = mq::fuses_row(m, nb);
  constexpr int R = mq::kGemvRows;
  struct Way {
    std::string label;
    bool fused, lane_sums;  // lane_sums: gemv_kernel's kLaneSums, launched here (the op does not yet)
    const void* kernel;
  };
  std::vector<Way> ways;
  if (own_fused) {
    ways.push_back({"one launch", true, false, reinterpret_cast<const void*>(mq::gemv_kernel<F, float, 1, true>)});
    ways.push_back({"one launch, a lane's sums", true, true,
                    reinterpret_cast<const void*>(mq::gemv_kernel<F, float, 1, true, true>)});
  }
  ways.push_back({"two launches", false, false,
                  m == 1 ? reinterpret_cast<const void*>(mq::gemv_kernel<F, float, 1, false>)
                         : reinterpret_cast<const void*>(mq::gemv_kernel<F, float, R, false>)});
  ways.push_back({"two launches, a lane's sums", false, true,
                  m == 1 ? reinterpret_cast<const void*>(mq::gemv_kernel<F, float, 1, false, true>)
                         : reinterpret_cast<const void*>(mq::gemv_kernel<F, float, R, false, true>)});
  std::vector<std::function<void(int)>> launches;
  std::vector<std::vector<float>> outputs;
  for (const Way& way : ways) {
    const auto launch = [&, fused = way.fused, lane_sums = way.lane_sums](int s) {
      const mq::WeightView wv = mq::weight_view(w[s], nb * quant::block_bytes(F), 1, F, nb);
      if (!lane_sums) {
        mq::launch_product<float>(y, x, walk, wv, fused ? mq::QuantizedX{} : xq, F, m, n, nb, fused, stream);
        return;
      }
      if (!fused) cuda::launch_quantize_blocks<quant::Format::q8_0>(mq::QuantizedXSink{xq}, x, walk, m * nb, stream);
      const unsigned grid = cuda::blocks_for(n * 32, mq::kThreads);
      const mq::RowOfX<float> row{x, walk};
      if (fused)
        mq::gemv_kernel<F, float, 1, true, true><<<grid, mq::kThreads, 0, stream>>>(y, mq::QuantizedX{}, row, wv, 1, n, nb);
      else if (m == 1)
        mq::gemv_kernel<F, float, 1, false, true><<<grid, mq::kThreads, 0, stream>>>(y, xq, row, wv, 1, n, nb);
      else
        mq::gemv_kernel<F, float, R, false, true><<<grid, mq::kThreads, 0, stream>>>(y, xq, row, wv, int(m), n, nb);
    };
    launch(0);
    check(cudaGetLastError(), way.label.c_str());
    check(cudaStreamSynchronize(stream), way.label.c_str());
    outputs.push_back(to_host(y, m * n));
    launches.push_back(launch);
  }
  bool ok = true;
  std::vector<float> diffs(ways.size(), 0.0f);
  for (size_t i = 1; i < ways.size(); ++i) {
    for (int64_t c = 0; c < m * n; ++c) diffs[i] = std::max(diffs[i], std::fabs(outputs[i][c] - outputs[0][c]));
    if (!(diffs[i] == 0.0f)) {
      std::fprintf(stderr, "schedules_cuda: matmul_q %s, %lld rows: %s and %s differ by %g\n", quant::format_name(F),
                   static_cast<long long>(m), ways[i].label.c_str(), ways[0].label.c_str(), diffs[i]);
      ok = false;
    }
  }
  const std::vector<float> us = median_times(launches, sets, repeats, stream);
  const std::string op = std::string("matmul_q ") + quant::format_name(F) + " " + std::to_string(m) + "x" +
                         std::to_string(k) + " @ " +
                         std::to_string(n) + "x" + std::to_string(k) + "^T";
  const double bytes = double(w_bytes) + 4.0 * m * (k + n);
  for (size_t i = 0; i < ways.size(); ++i) {
    cudaFuncAttributes attr{};
    check(cudaFuncGetAttributes(&attr, ways[i].kernel), "attributes");
    int blocks = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, ways[i].kernel, mq::kThreads, 0), "occupancy");
    const float gbps = static_cast<float>(bytes / (us[i] * 1e3));
    table.push_back({op, "float32", ways[i].label + (ways[i].fused == own_fused && !ways[i].lane_sums ? " (the op's)" : ""), mq::kThreads,
                     attr.numRegs, static_cast<int>(attr.localSizeBytes), blocks, us[i], gbps,
                     100.0f * gbps / copy_gbps, us[0] / us[i], diffs[i]});
  }
  for (uint8_t* p : w) cudaFree(p);
  cudaFree(x);
  cudaFree(y);
  cudaFree(workspace);
  cudaStreamDestroy(stream);
  return ok;
}

// scatter_add's summing kernel (ops/scatter_add/scatter_add.cuh): rows x n source rows into
// `buckets` output rows, dim 0 (the benchmark's layout), the index random, the sort's results (each
// bucket's positions in increasing order, the buckets' starts) made on the host; the op's other
// kernels (index check, sort) are not timed here. Every schedule adds in the same order: the
// outputs must be equal. Sources rotated past three times the L2. Returns false if any differs.
template <typename T>
bool run_scatter_add(const char* dtype, int64_t rows, int64_t n, int64_t buckets, int sets, float copy_gbps,
                     int repeats, std::vector<Row>& table) {
  namespace sa = scatter_add_cuda;
  std::vector<int64_t> index(rows), order, start(buckets + 1, 0);
  std::mt19937 gen(17);
  for (int64_t& v : index) v = static_cast<int64_t>(gen() % buckets);
  for (int64_t b = 0; b < buckets; ++b) {  // a stable sort by bucket
    start[b] = static_cast<int64_t>(order.size());
    for (int64_t r = 0; r < rows; ++r)
      if (index[r] == b) order.push_back(r);
  }
  start[buckets] = rows;
  int64_t *d_order = nullptr, *d_start = nullptr;
  check(cudaMalloc(&d_order, rows * sizeof(int64_t)), "cudaMalloc");
  check(cudaMalloc(&d_start, (buckets + 1) * sizeof(int64_t)), "cudaMalloc");
  check(cudaMemcpy(d_order, order.data(), rows * sizeof(int64_t), cudaMemcpyHostToDevice), "order");
  check(cudaMemcpy(d_start, start.data(), (buckets + 1) * sizeof(int64_t), cudaMemcpyHostToDevice), "start");
  std::vector<T*> src(sets);
  for (int set = 0; set < sets; ++set) src[set] = device_array<T>(rows * n, 31 + set);
  T *out = device_array<T>(buckets * n, 0), *own_out = device_array<T>(buckets * n, 0);
  check(cudaDeviceSynchronize(), "fill");
  scatter_cuda::SliceIndexers s;  // [n] slices along dim 0, contiguous
  s.inner.rank = 1;
  s.inner.narrow = true;
  s.inner.shape[0] = n;
  s.inner.strides[0] = 1;
  s.inner_size = n;
  s.step = n;
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");

  struct Way {
    std::string label;
    const void* kernel;
    int threads, columns;
    void (*launch)(T*, const T*, const scatter_cuda::SliceIndexers&, const int64_t*, const int64_t*, int64_t,
                   int64_t, cudaStream_t);
  };
  std::vector<Way> ways;
  // The op's own schedules first (its pair of columns for this layout where the elements allow,
  // then the one it runs elsewhere), then the others once each.
  using OwnHere = std::conditional_t<sizeof(T) <= 4, sa::OwnPairSum, sa::OwnSum<T>>;
  const auto add = [&]<class S>(std::type_identity<S>, const char* own) {
    if (!*own && (std::is_same_v<S, OwnHere> || std::is_same_v<S, sa::OwnSum<T>>)) return;
    ways.push_back({std::to_string(S::kAhead) + " rows ahead, " + std::to_string(S::kThreads) + " threads, " +
                        std::to_string(S::kColumns) + (S::kColumns == 1 ? " column" : " columns") + own,
                    reinterpret_cast<const void*>(sa::sum_kernel<T, S>), S::kThreads, S::kColumns,
                    sa::launch_sum<T, S>});
  };
  using sa::SumSchedule;
  add(std::type_identity<OwnHere>{}, " (the op's)");
  if constexpr (!std::is_same_v<OwnHere, sa::OwnSum<T>>)
    add(std::type_identity<sa::OwnSum<T>>{}, " (the op's where 2 columns do not fit)");
  add(std::type_identity<SumSchedule<16, 256, 1>>{}, "");
  add(std::type_identity<SumSchedule<32, 256, 1>>{}, "");  // the op's one column before 2026-11-27
  add(std::type_identity<SumSchedule<64, 256, 1>>{}, "");
  add(std::type_identity<SumSchedule<32, 128, 1>>{}, "");
  add(std::type_identity<SumSchedule<16, 128, 2>>{}, "");
  add(std::type_identity<SumSchedule<32, 128, 2>>{}, "");
  add(std::type_identity<SumSchedule<8, 128, 4>>{}, "");
  add(std::type_identity<SumSchedule<16, 128, 4>>{}, "");
  add(std::type_identity<SumSchedule<16, 64, 4>>{}, "");

  bool ok = true;
  std::vector<float> diffs(ways.size(), 0.0f);
  std::vector<std::function<void(int)>> launches;
  for (size_t i = 0; i < ways.size(); ++i) {
    if (!sa::columns_fit(ways[i].columns, s, src[0], out, sizeof(T))) {
      launches.emplace_back();
      continue;
    }
    ways[i].launch(i ? out : own_out, src[0], s, d_start, d_order, buckets, buckets * n, stream);
    check(cudaGetLastError(), ways[i].label.c_str());
    diffs[i] = max_difference(i ? out : own_out, own_out, buckets * n, stream).first;
    if (!(diffs[i] == 0.0f)) {
      std::fprintf(stderr, "schedules_cuda: scatter_add %s %s differs from the op's own by %g\n", dtype,
                   ways[i].label.c_str(), diffs[i]);
      ok = false;
    }
    launches.push_back(
        [&, w = ways[i]](int set) { w.launch(out, src[set], s, d_start, d_order, buckets, buckets * n, stream); });
  }
  const std::vector<float> us = median_times(launches, sets, repeats, stream);
  const double bytes = double(rows * n + buckets * n) * sizeof(T) + rows * sizeof(int64_t);
  const std::string op = "scatter_add " + std::to_string(rows) + "x" + std::to_string(n) + " into " +
                         std::to_string(buckets);
  for (size_t i = 0; i < ways.size(); ++i) {
    if (!launches[i]) continue;
    cudaFuncAttributes attr{};
    check(cudaFuncGetAttributes(&attr, ways[i].kernel), "attributes");
    int blocks = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, ways[i].kernel, ways[i].threads, 0), "occupancy");
    const float gbps = static_cast<float>(bytes / (us[i] * 1e3));
    table.push_back({op, dtype, ways[i].label, ways[i].threads, attr.numRegs, static_cast<int>(attr.localSizeBytes),
                     blocks, us[i], gbps, 100.0f * gbps / copy_gbps, us[0] / us[i], diffs[i]});
  }
  for (T* p : src) cudaFree(p);
  cudaFree(out);
  cudaFree(own_out);
  cudaFree(d_order);
  cudaFree(d_start);
  cudaStreamDestroy(stream);
  return ok;
}

// The device-to-device copy's bandwidth (read + write) over buffers of `bytes`, median of repeats.
float copy_gbps(int64_t bytes, int repeats) {
  void *src, *dst;
  check(cudaMalloc(&src, bytes), "cudaMalloc");
  check(cudaMalloc(&dst, bytes), "cudaMalloc");
  cudaEvent_t start, end;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&end), "event");
  std::vector<float> us;
  for (int r = -2; r < repeats; ++r) {
    check(cudaEventRecord(start), "record");
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice), "copy");
    check(cudaEventRecord(end), "record");
    check(cudaEventSynchronize(end), "copy");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, end), "elapsed");
    if (r >= 0) us.push_back(ms * 1e3f);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  cudaFree(src);
  cudaFree(dst);
  return static_cast<float>(2.0 * bytes / (median(us) * 1e3));
}

}  // namespace

// main's work; the CUDA emulator's test of this program calls it at a toy size.
int schedules_cuda_main(int argc, char** argv) {
  const char* csv_path = argc > 1 ? argv[1] : nullptr;
  const int64_t rows = argc > 2 ? std::atoll(argv[2]) : 16384;
  const int64_t n = argc > 3 ? std::atoll(argv[3]) : 4096;
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 30;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device");
  // Enough input/output sets that a call's reads are not in the L2 from the calls before.
  const int64_t f32_bytes = rows * n * 4;
  const int sets = static_cast<int>(std::max<int64_t>(2, (3LL * prop.l2CacheSize) / (2 * f32_bytes) + 1));
  const float copy = copy_gbps(f32_bytes, repeats);
  std::printf("%s, %d SMs, L2 %d MiB; copy (read + write, %lld MiB): %.0f GB/s; %lld x %lld, %d input sets\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, (long long)(f32_bytes >> 20), copy,
              (long long)rows, (long long)n, sets);
  std::vector<Row> table;
  bool ok = run<float>("float32", rows, n, sets, copy, repeats, table);
  ok = run<__nv_bfloat16>("bfloat16", rows, n, sets, copy, repeats, table) && ok;
  ok = run_scatter_add<float>("float32", rows, n, 16, sets, copy, repeats, table) && ok;
  ok = run_scatter_add<__nv_bfloat16>("bfloat16", rows, n, 16, sets, copy, repeats, table) && ok;
  for (const int64_t m : {int64_t{1}, int64_t{matmul_q_cuda::kGemvRows}}) {  // a token; a batch of the gemv's most
    ok = run_matmul_q<quant::Format::q4_0>(m, n, n, prop.l2CacheSize, copy, repeats, table) && ok;
    ok = run_matmul_q<quant::Format::q8_0>(m, n, n, prop.l2CacheSize, copy, repeats, table) && ok;
  }

  std::printf("\n| op | dtype | schedule | threads | registers | local bytes | blocks/SM | us | GB/s | %% of copy |"
              " vs the op's own | max diff |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Row& r : table)
    std::printf("| %s | %s | %s | %d | %d | %d | %d | %.1f | %.0f | %.1f%% | %.3fx | %.2g |\n", r.op.c_str(),
                r.dtype.c_str(), r.schedule.c_str(), r.threads, r.regs, r.local_bytes, r.blocks_per_sm, r.us, r.gbps,
                r.pct_copy, r.vs_own, r.max_diff);
  std::printf("\nvs the op's own: its time / this schedule's (above 1: this schedule is faster). local bytes: "
              "local memory per thread (spills).\n");
  if (csv_path) {
    FILE* f = std::fopen(csv_path, "w");
    if (!f) {
      std::fprintf(stderr, "schedules_cuda: cannot write %s\n", csv_path);
      return 2;
    }
    std::fprintf(f, "device,op,dtype,schedule,threads,registers,local_bytes,blocks_per_sm,us,gbps,pct_copy,vs_own,"
                    "max_diff\n");
    for (const Row& r : table)
      std::fprintf(f, "%s,%s,%s,\"%s\",%d,%d,%d,%d,%.2f,%.1f,%.2f,%.4f,%.3g\n", prop.name, r.op.c_str(),
                   r.dtype.c_str(), r.schedule.c_str(), r.threads, r.regs, r.local_bytes, r.blocks_per_sm, r.us,
                   r.gbps, r.pct_copy, r.vs_own, r.max_diff);
    std::fclose(f);
  }
  return ok ? 0 : 1;
}

#ifndef CUDA_EMU_ARCH
int main(int argc, char** argv) { return schedules_cuda_main(argc, argv); }
#endif
