// The emulated device: its memory (pages of their own between unmapped ones), the CUDA runtime
// calls opforge's kernels make, and the "cuda_emulated" backend the rewritten kernels register
// with. See cuda_emulator.h.
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "emulator.h"
#include "opforge/backend.h"

namespace cuda_emu {
namespace {

constexpr size_t kPage = 4096;

// Device memory regions by the address handed out: the mapping to return.
struct Region {
  char* base;
  size_t bytes;
};
std::mutex memory_mutex;
std::map<const void*, Region>& regions() {
  static std::map<const void*, Region> table;
  return table;
}

thread_local cudaError_t last_error = cudaSuccess;

cudaError_t fail_with(cudaError_t e) {
  last_error = e;
  return e;
}

// cudaMallocAsync refuses more than this (set_allocation_limit).
std::atomic<size_t> allocation_limit{size_t{8} << 30};

}  // namespace

void* allocate(size_t bytes) {
  const size_t data = (std::max<size_t>(bytes, 1) + 15) & ~size_t{15};
  const size_t span = (data + kPage - 1) & ~(kPage - 1);
  void* p = mmap(nullptr, span + 2 * kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  char* base = static_cast<char*>(p);
  mprotect(base + kPage, span, PROT_READ | PROT_WRITE);
  char* start = base + kPage + span - data;  // 16-byte aligned, its end against the page above
  std::memset(start, 0xff, data);
  std::lock_guard lock(memory_mutex);
  regions()[start] = {base, span + 2 * kPage};
  return start;
}

void release(void* p) {
  if (!p) return;
  std::lock_guard lock(memory_mutex);
  auto it = regions().find(p);
  if (it == regions().end()) throw KernelFault("freeing memory the emulated device did not allocate");
  munmap(it->second.base, it->second.bytes);
  regions().erase(it);
}

size_t set_allocation_limit(size_t bytes) { return allocation_limit.exchange(bytes); }

size_t live_allocations() {
  std::lock_guard lock(memory_mutex);
  return regions().size();
}

namespace {

// The emulated device behind the kernels' "cuda_emulated" registrations. Lowest score: on a
// machine with a GPU the real backend keeps the CUDA tensors; tests force this one by name.
class EmulatedCuda final : public opforge::Backend {
 public:
  std::string name() const override { return "cuda_emulated"; }
  opforge::DeviceType device_type() const override { return opforge::DeviceType::cuda; }
  bool available() const override { return true; }
  int score() const override { return 0; }
  int64_t device_count() const override { return 1; }
  void* allocate(int64_t bytes, opforge::Device, void*) override { return cuda_emu::allocate(size_t(bytes)); }
  void release(void* ptr, opforge::Device, void*) noexcept override {
    try {
      cuda_emu::release(ptr);
    } catch (...) {
    }
  }
  void copy(void* dst, const void* src, int64_t bytes, void*) override { std::memcpy(dst, src, size_t(bytes)); }
  void synchronize(opforge::Device, void*) override {}
};

[[maybe_unused]] const bool registered = [] {
  opforge::register_backend(std::make_unique<EmulatedCuda>());
  return true;
}();

}  // namespace
}  // namespace cuda_emu

// The CUDA runtime calls opforge's kernels make. Streams are accepted and ignored: every call has
// finished when it returns.
extern "C" {

cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  cuda_emu::record_stream_use("cudaMallocAsync", stream);
  *p = bytes > cuda_emu::allocation_limit.load() ? nullptr : cuda_emu::allocate(bytes);
  return *p ? cudaSuccess : cuda_emu::fail_with(cudaErrorMemoryAllocation);
}
cudaError_t cudaMalloc(void** p, size_t bytes) { return cudaMallocAsync(p, bytes, nullptr); }  // recorded as the legacy stream's
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  cuda_emu::record_stream_use("cudaFreeAsync", stream);
  cuda_emu::release(p);
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) { return cudaFreeAsync(p, nullptr); }
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  cuda_emu::record_stream_use("cudaMemsetAsync", stream);
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) { return cudaMemsetAsync(p, value, bytes, nullptr); }
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t stream) {
  cuda_emu::record_stream_use("cudaMemcpyAsync", stream);
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  cuda_emu::record_stream_use("cudaStreamSynchronize", stream);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  cuda_emu::record_stream_use("cudaDeviceSynchronize", nullptr);
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() { return std::exchange(cuda_emu::last_error, cudaSuccess); }
cudaError_t cudaPeekAtLastError() { return cuda_emu::last_error; }
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    default: return "unknown error (emulated)";
  }
}

}  // extern "C"
