// opforge's CUDA sources compiled for the CPU, so the kernels' own code runs (and is tested) on a
// machine without a GPU. rewrite_launches.py first turns each `kernel<<<grid, block, shared,
// stream>>>(args)` into a cuda_emu::launch and sends the sources' kernel registrations to the
// "cuda_emulated" backend; the compiler then force-includes this file ahead of each source.
//
// A launch runs its blocks one after another; each GPU thread of a block is a fiber (a stack of
// its own) running the kernel's code as written. A fiber runs until it meets __syncthreads or a
// warp operation, where it waits for the threads that operation needs, so the kernels' barriers
// and shuffles mean what they mean on the GPU, and misuse the hardware would punish (a barrier
// only part of the block reaches, lanes that disagree on a shuffle's mask, a shuffle from a lane
// that is not there, a deadlock, more threads than __launch_bounds__, more than 256 threads from a
// kernel without it, whose registers may not fit such a block) stops the launch with
// cuda_emu::KernelFault.
//
// What it cannot see: timing; data races, except those that the order of turns decides (threads
// run one at a time until they block, forward or, with set_schedule, in reverse; atomics are
// plain read-modify-writes); register and shared-memory limits; most of the streams' asynchrony
// (every call completes before it returns, except that a copy into host memory lands only at the
// next synchronize); device math's last-bit differences (the host's libm, no FMA
// contraction). The sources' __CUDA_ARCH__ reads as CUDA_EMU_ARCH, sm_90: the sm_80+ paths (warp
// reductions by __reduce_*_sync) are the ones run here, as on the GPUs the package is built for.
#pragma once

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>  // the float overloads (fmax, sqrt, ...) in the global namespace, as CUDA has them

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "emulator.h"

// What the rewritten sources' __CUDA_ARCH__ reads as (rewrite_launches.py).
#define CUDA_EMU_ARCH 900
// The grid-stride launches' cap on blocks (opforge/cuda/common.cuh grid_blocks), set by the tests.
#define CUDA_EMU_GRID_CAP ::cuda_emu::grid_cap()

// A block's threads are fibers of one OS thread, and blocks run one at a time there: a static
// per-thread variable is one per block.
#undef __shared__
#define __shared__ static thread_local
#define __launch_bounds__(...)

// The kernels' registrations (OPFORGE_KERNEL(op, "cuda", ...), rewritten) name the emulated backend.
#define CUDA_EMU_KERNEL(op, backend, dtypes, fn) OPFORGE_KERNEL(op, "cuda_emulated", dtypes, fn)

namespace cuda_emu {

struct ThreadContext {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
  unsigned lane, warp;  // of the thread's linear index in its block
};
extern thread_local const ThreadContext* current;  // the running fiber's

// Stops the launch from device code with a KernelFault saying `what` (and which thread).
[[noreturn]] void fault(const std::string& what);
// __syncthreads and __syncthreads_or; `file:line` tells the barriers apart.
int sync_block(int predicate, const char* file, int line);
// The lanes of `mask` meet: each leaves `size` bytes (at most 16) of `value` in its slot; returns
// the warp's 32 slots, 16 bytes apart, valid until the warp's next operation.
const unsigned char* warp_exchange(unsigned mask, const void* value, size_t size, const char* what);

// A kernel's __launch_bounds__ (rewrite_launches.py puts the call at its start): more threads per
// block than `max_threads` is a launch the GPU refuses.
void check_launch_bounds(long long max_threads);
// A __shared__ variable (the same per block): the first thread of a block to declare it fills it
// with 0xff bytes, so a read before any write shows as NaN or -1, as garbage would on the GPU.
void poison_shared(void* variable, size_t bytes);

// Runs `body(closure)` once per thread of the grid.
void run_grid(const char* name, dim3 grid, dim3 block, size_t shared_bytes, void (*body)(void*), void* closure);

template <class Kernel>
struct Launch {
  const char* name;
  Kernel kernel;
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;

  // The arguments are copied once, as a launch copies them to the device; each thread's call gets
  // its own copy of those (the kernel's parameters are by value).
  template <class... Args>
  void operator()(Args&&... args) const {
    record_stream_use(name, stream);
    note_launch(name);
    std::tuple<std::decay_t<Args>...> params(std::forward<Args>(args)...);
    auto body = [&] { std::apply(kernel, params); };
    run_grid(name, grid, block, shared_bytes, [](void* c) { (*static_cast<decltype(body)*>(c))(); }, &body);
  }
};

template <class Kernel>
Launch<Kernel> launch(const char* name, Kernel kernel, dim3 grid, dim3 block, size_t shared_bytes = 0,
                      cudaStream_t stream = nullptr) {
  return {name, kernel, grid, block, shared_bytes, stream};
}

template <class T>
T from_lane(const unsigned char* slots, unsigned mask, int lane, const char* what) {
  if (!(mask >> lane & 1u))
    fault(std::string(what) + " reads lane " + std::to_string(lane) + ", which is not in the mask");
  T v;
  std::memcpy(&v, slots + 16 * lane, sizeof(T));
  return v;
}

template <class T>
const unsigned char* exchange(unsigned mask, const T& value, const char* what) {
  static_assert(sizeof(T) <= 16 && std::is_trivially_copyable_v<T>, "a shuffle moves at most 16 bytes");
  return warp_exchange(mask, &value, sizeof(T), what);
}

// The lane a shuffle reads within `width`-lane segments; its own where the source is outside.
inline int segment_lane(int lane, int source, int width) {
  const int base = lane & ~(width - 1);
  return source >= base && source < base + width ? source : lane;
}

}  // namespace cuda_emu

#define threadIdx (::cuda_emu::current->thread)
#define blockIdx (::cuda_emu::current->block)
#define blockDim (::cuda_emu::current->block_dim)
#define gridDim (::cuda_emu::current->grid_dim)
#define __syncthreads() ((void)::cuda_emu::sync_block(0, __FILE__, __LINE__))
#define __syncthreads_or(predicate) ::cuda_emu::sync_block((predicate) != 0, __FILE__, __LINE__)

inline constexpr int warpSize = 32;

inline void __syncwarp(unsigned mask = 0xffffffffu) { cuda_emu::warp_exchange(mask, nullptr, 0, "__syncwarp"); }

template <class T>
T __shfl_sync(unsigned mask, T value, int source, int width = 32) {
  const unsigned char* slots = cuda_emu::exchange(mask, value, "__shfl_sync");
  const int lane = static_cast<int>(cuda_emu::current->lane);
  return cuda_emu::from_lane<T>(slots, mask, (lane & ~(width - 1)) + (source & (width - 1)), "__shfl_sync");
}
template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  const unsigned char* slots = cuda_emu::exchange(mask, value, "__shfl_xor_sync");
  const int lane = static_cast<int>(cuda_emu::current->lane);
  return cuda_emu::from_lane<T>(slots, mask, cuda_emu::segment_lane(lane, lane ^ lane_mask, width), "__shfl_xor_sync");
}
template <class T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  const unsigned char* slots = cuda_emu::exchange(mask, value, "__shfl_down_sync");
  const int lane = static_cast<int>(cuda_emu::current->lane);
  return cuda_emu::from_lane<T>(slots, mask, cuda_emu::segment_lane(lane, lane + int(delta), width), "__shfl_down_sync");
}
template <class T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  const unsigned char* slots = cuda_emu::exchange(mask, value, "__shfl_up_sync");
  const int lane = static_cast<int>(cuda_emu::current->lane);
  return cuda_emu::from_lane<T>(slots, mask, cuda_emu::segment_lane(lane, lane - int(delta), width), "__shfl_up_sync");
}

namespace cuda_emu {
// Folds the values of the mask's lanes (read from the slots every lane sees alike) with op.
template <class T, class Op>
T warp_fold(unsigned mask, T value, Op op, const char* what) {
  const unsigned char* slots = exchange(mask, value, what);
  bool first = true;
  T acc{};
  for (int l = 0; l < 32; ++l)
    if (mask >> l & 1u) {
      const T v = from_lane<T>(slots, mask, l, what);
      acc = first ? v : op(acc, v);
      first = false;
    }
  return acc;
}
}  // namespace cuda_emu

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return cuda_emu::warp_fold<unsigned>(mask, predicate ? 1u << cuda_emu::current->lane : 0u,
                                       [](unsigned a, unsigned b) { return a | b; }, "__ballot_sync");
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) == mask; }
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
  return cuda_emu::warp_fold<unsigned>(mask, v, [](unsigned a, unsigned b) { return a > b ? a : b; }, "__reduce_max_sync");
}
inline int __reduce_max_sync(unsigned mask, int v) {
  return cuda_emu::warp_fold<int>(mask, v, [](int a, int b) { return a > b ? a : b; }, "__reduce_max_sync");
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) {
  return cuda_emu::warp_fold<unsigned>(mask, v, [](unsigned a, unsigned b) { return a + b; }, "__reduce_add_sync");
}
inline int __reduce_add_sync(unsigned mask, int v) {
  return cuda_emu::warp_fold<int>(mask, v, [](int a, int b) { return int(unsigned(a) + unsigned(b)); }, "__reduce_add_sync");
}

// Atomics: the threads of a launch run one at a time, so a plain read-modify-write is atomic.
template <class T> T atomicAdd(T* p, T v) { const T old = *p; *p = old + v; return old; }
template <class T> T atomicMin(T* p, T v) { const T old = *p; *p = v < old ? v : old; return old; }
template <class T> T atomicMax(T* p, T v) { const T old = *p; *p = v > old ? v : old; return old; }
template <class T> T atomicExch(T* p, T v) { const T old = *p; *p = v; return old; }
template <class T> T atomicCAS(T* p, T expected, T v) { const T old = *p; if (old == expected) *p = v; return old; }

// Integer and float min/max as CUDA's headers declare them for device code.
#define CUDA_EMU_MIN_MAX(T)                                  \
  inline T min(T a, T b) { return b < a ? b : a; }           \
  inline T max(T a, T b) { return a < b ? b : a; }
CUDA_EMU_MIN_MAX(int)
CUDA_EMU_MIN_MAX(unsigned)
CUDA_EMU_MIN_MAX(long)
CUDA_EMU_MIN_MAX(unsigned long)
CUDA_EMU_MIN_MAX(long long)
CUDA_EMU_MIN_MAX(unsigned long long)
#undef CUDA_EMU_MIN_MAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// Rounded arithmetic: the host's IEEE operations round to nearest, and the host compiler does not
// contract them into FMAs in ISO C++ mode.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.f / a; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline float __double2float_rn(double v) { return static_cast<float>(v); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float v) { return expf(v); }
inline float __logf(float v) { return logf(v); }
inline float __sinf(float v) { return sinf(v); }
inline float __cosf(float v) { return cosf(v); }
inline float __saturatef(float v) { return v < 0.f ? 0.f : (v > 1.f ? 1.f : (v == v ? v : 0.f)); }
inline float normcdff(float v) { return 0.5f * erfcf(-v * 0.70710678118654752f); }
inline double normcdf(double v) { return 0.5 * erfc(-v * 0.70710678118654752440); }
inline float rsqrtf(float v) { return 1.f / sqrtf(v); }
inline double rsqrt(double v) { return 1.0 / sqrt(v); }

inline unsigned __float_as_uint(float v) { return std::bit_cast<unsigned>(v); }
inline float __uint_as_float(unsigned v) { return std::bit_cast<float>(v); }
inline int __float_as_int(float v) { return std::bit_cast<int>(v); }
inline float __int_as_float(int v) { return std::bit_cast<float>(v); }
inline long long __double_as_longlong(double v) { return std::bit_cast<long long>(v); }
inline double __longlong_as_double(long long v) { return std::bit_cast<double>(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
// (hi:lo) >> (shift & 31), the low 32 bits, as the GPU's funnel shift (shf.r.wrap).
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  return static_cast<unsigned>(((static_cast<unsigned long long>(hi) << 32) | lo) >> (shift & 31));
}
inline int __ffsll(long long v) { return __builtin_ffsll(v); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz(static_cast<unsigned>(v)); }
inline int __clzll(long long v) { return v == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(v)); }

// Four signed (or unsigned) byte products of a and b, summed, plus c.
inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; ++i)
    c += static_cast<int>(static_cast<int8_t>(a >> (8 * i))) * static_cast<int>(static_cast<int8_t>(b >> (8 * i)));
  return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
  for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 0xffu) * ((b >> (8 * i)) & 0xffu);
  return c;
}

template <class T> T __ldg(const T* p) { return *p; }
// Streaming (evict-first) loads and stores: cache hints only, plain accesses here.
template <class T> T __ldcs(const T* p) { return *p; }
template <class T> void __stcs(T* p, T v) { *p = v; }
