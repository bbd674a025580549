// The emulated devices: their memory (pages of their own between unmapped ones) and the CUDA
// runtime calls opforge's kernels and its CUDA backend make (memory, copies, the current device,
// events). The backend itself is opforge's own, src/backends/cuda_backend.cu, compiled here as
// "cuda_emulated", the name the rewritten kernels register with. See cuda_emulator.h.
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "emulator.h"

namespace cuda_emu {
namespace {

constexpr size_t kPage = 4096;

// Device memory regions by the address handed out: the mapping to return, and the bytes asked for.
struct Region {
  char* base;
  size_t bytes;
  size_t asked;
};

// Fills the mapped bytes around an allocation (before its start on the page, after its end up to
// the next 16 bytes): a write there, which no page boundary catches, shows at release.
constexpr unsigned char kCanary = 0xa5;

std::mutex memory_mutex;
std::map<const void*, Region>& regions() {
  static std::map<const void*, Region> table;
  return table;
}

// The calling thread's runtime state.
thread_local cudaError_t last_error = cudaSuccess;
thread_local std::string unchecked_launch;  // note_launch
thread_local int current = 0;               // the current device

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
  std::memset(base + kPage, kCanary, span);
  std::memset(start, 0xff, bytes);
  std::lock_guard lock(memory_mutex);
  regions()[start] = {base, span + 2 * kPage, bytes};
  return start;
}

void release(void* p) {
  if (!p) return;
  std::lock_guard lock(memory_mutex);
  auto it = regions().find(p);
  if (it == regions().end()) throw KernelFault("freeing memory the emulated device did not allocate");
  const Region r = it->second;
  regions().erase(it);
  const char* first = r.base + kPage;
  const char* start = static_cast<const char*>(p);
  const char* end = r.base + r.bytes - kPage;
  auto touched = [](const char* from, const char* to) {
    return std::find_if(from, to, [](char c) { return static_cast<unsigned char>(c) != kCanary; });
  };
  auto bytes = [](int64_t n) { return std::to_string(n) + (n == 1 ? " byte" : " bytes"); };
  std::string stray;
  if (const char* c = touched(first, start); c != start) stray = bytes(start - c) + " before its start";
  if (const char* c = touched(start + r.asked, end); c != end) stray = bytes(c - start - r.asked + 1) + " past its end";
  munmap(r.base, r.bytes);
  if (!stray.empty())
    throw KernelFault("a write " + stray + " of a device allocation of " + std::to_string(r.asked) + " bytes");
}

size_t set_allocation_limit(size_t bytes) { return allocation_limit.exchange(bytes); }

std::atomic<bool> cuda_malloc_allowed{false};
bool allow_cuda_malloc(bool allowed) { return cuda_malloc_allowed.exchange(allowed); }

namespace {
std::atomic<const void*> capturing{nullptr};

// A wait for the device while a stream captures a graph: on a GPU, cudaErrorStreamCaptureUnsupported
// and the capture is lost; here, a fault (opforge must not try).
void refuse_while_capturing(const char* call) {
  if (capturing.load())
    throw KernelFault(std::string(call) + " while the caller's stream captures a CUDA graph (the capture would fail)");
}
}  // namespace

const void* set_capturing_stream(const void* stream) { return capturing.exchange(stream); }

namespace {
// Whether p points into emulated device memory.
bool on_device(const void* p) {
  std::lock_guard lock(memory_mutex);
  auto it = regions().upper_bound(p);
  if (it == regions().begin()) return false;
  --it;
  return static_cast<const char*>(p) < static_cast<const char*>(it->first) + it->second.asked;
}

// Copies from the device into host memory by cudaMemcpyAsync: their bytes as the stream had them
// (everything before them has run), landing only at the next synchronize, as a GPU's would land
// at some time the host does not know without one.
struct PendingCopy {
  void* dst;
  std::vector<char> bytes;
  uint64_t number;  // the copies queued before it on this thread
};
thread_local std::vector<PendingCopy> pending_copies;
thread_local uint64_t copies_queued = 0;

// Lands the copies queued before the `before`-th (all of them by default): an event waits only
// for the work queued ahead of its record.
void land_copies(uint64_t before = UINT64_MAX) {
  std::erase_if(pending_copies, [&](const PendingCopy& c) {
    if (c.number >= before) return false;
    std::memcpy(c.dst, c.bytes.data(), c.bytes.size());
    return true;
  });
}
}  // namespace

size_t take_unwaited_copies() { return std::exchange(pending_copies, {}).size(); }

namespace {
std::mutex fault_mutex;
std::vector<std::string>& memory_faults() {
  static std::vector<std::string> faults;
  return faults;
}
}  // namespace

void note_memory_fault(const std::string& what) {
  std::lock_guard lock(fault_mutex);
  memory_faults().push_back(what);
}
std::vector<std::string> take_memory_faults() {
  std::lock_guard lock(fault_mutex);
  return std::exchange(memory_faults(), {});
}

size_t live_allocations() {
  std::lock_guard lock(memory_mutex);
  return regions().size();
}

namespace {
std::mutex event_mutex;
std::set<const void*>& events() {
  static std::set<const void*> table;
  return table;
}
}  // namespace

int current_device() { return current; }

void note_launch(const char* name) { unchecked_launch = name; }
std::string take_unchecked_launch() { return std::exchange(unchecked_launch, {}); }

size_t live_events() {
  std::lock_guard lock(event_mutex);
  return events().size();
}

}  // namespace cuda_emu

// An event: the device current when it was made (it records on that device's streams only), and
// when it was last recorded (every call before it has finished: the host's clock is the device's).
struct CUevent_st {
  int device;
  std::chrono::steady_clock::time_point recorded{};
  const void* stream = nullptr;  // where it was last recorded
  uint64_t copies_before = 0;    // the thread's copies into host memory queued before that record
};

// A memory pool: its device, its release threshold, and the allocations made from it.
struct CUmemPoolHandle_st {
  int device;
  uint64_t release_threshold = 0;  // the runtime's default: nothing kept across synchronizations
  int64_t allocations = 0;
};

namespace cuda_emu {
namespace {
std::mutex pool_mutex;
std::vector<cudaMemPool_t>& pools() {
  static std::vector<cudaMemPool_t> table;
  return table;
}
}  // namespace

std::vector<PoolState> pool_states() {
  std::lock_guard lock(pool_mutex);
  std::vector<PoolState> states;
  for (cudaMemPool_t p : pools()) states.push_back({p->device, p->release_threshold, p->allocations});
  return states;
}
}  // namespace cuda_emu

namespace cuda_emu {
namespace {
// The event, if it is one the runtime made and has not destroyed; else a KernelFault naming `what`.
CUevent_st* live_event(cudaEvent_t event, const char* what) {
  std::lock_guard lock(event_mutex);
  if (!events().count(event)) throw KernelFault(std::string(what) + " on an event that does not exist (destroyed?)");
  return event;
}
}  // namespace
}  // namespace cuda_emu

// The CUDA runtime calls opforge's kernels and backend make. Each has finished when it returns
// (streams are recorded, not modelled), except a copy from the device into host memory, which
// lands at the next synchronize.
extern "C" {

// opforge's temporary memory comes from its own pool (or the caller's allocator), never from the
// runtime's default pool, which hands memory back to the driver at every synchronize.
cudaError_t cudaMallocAsync(void**, size_t, cudaStream_t) {
  throw cuda_emu::KernelFault("cudaMallocAsync: opforge allocates from its pool (opforge/cuda/scratch.h) or the caller's allocator");
}
cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (!cuda_emu::cuda_malloc_allowed.load())
    throw cuda_emu::KernelFault("cudaMalloc: synchronizes the device; opforge allocates from its pool");
  *p = bytes > cuda_emu::allocation_limit.load() ? nullptr : cuda_emu::allocate(bytes);
  return *p ? cudaSuccess : cuda_emu::fail_with(cudaErrorMemoryAllocation);
}
cudaError_t cudaMemPoolCreate(cudaMemPool_t* pool, const cudaMemPoolProps* props) {
  if (props->location.type != cudaMemLocationTypeDevice || props->location.id < 0 ||
      props->location.id >= cuda_emu::kDevices || props->allocType != cudaMemAllocationTypePinned)
    return cuda_emu::fail_with(cudaErrorInvalidValue);
  *pool = new CUmemPoolHandle_st{props->location.id};
  std::lock_guard lock(cuda_emu::pool_mutex);
  cuda_emu::pools().push_back(*pool);
  return cudaSuccess;
}
cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
  std::lock_guard lock(cuda_emu::pool_mutex);
  std::erase(cuda_emu::pools(), pool);
  delete pool;
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  if (attr != cudaMemPoolAttrReleaseThreshold) return cuda_emu::fail_with(cudaErrorInvalidValue);
  std::lock_guard lock(cuda_emu::pool_mutex);
  pool->release_threshold = *static_cast<const uint64_t*>(value);
  return cudaSuccess;
}
cudaError_t cudaMallocFromPoolAsync(void** p, size_t bytes, cudaMemPool_t pool, cudaStream_t stream) {
  cuda_emu::record_stream_use("cudaMallocFromPoolAsync", stream);
  {
    std::lock_guard lock(cuda_emu::pool_mutex);
    if (pool->device != cuda_emu::current)
      throw cuda_emu::KernelFault("cudaMallocFromPoolAsync from the pool of device " + std::to_string(pool->device) +
                                  " with device " + std::to_string(cuda_emu::current) + " current");
    ++pool->allocations;
  }
  *p = bytes > cuda_emu::allocation_limit.load() ? nullptr : cuda_emu::allocate(bytes);
  return *p ? cudaSuccess : cuda_emu::fail_with(cudaErrorMemoryAllocation);
}
// Frees from destructors (opforge::cuda::Scratch) may not throw: a stray write found here is kept
// for the test to collect (take_memory_faults).
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  cuda_emu::record_stream_use("cudaFreeAsync", stream);
  try {
    cuda_emu::release(p);
  } catch (const cuda_emu::KernelFault& e) {
    cuda_emu::note_memory_fault(e.what());
  }
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) { return cudaFreeAsync(p, nullptr); }
// Pinned host memory: host memory here (copies into it land at a synchronize, as into any).
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  *p = std::malloc(bytes ? bytes : 1);
  return *p ? cudaSuccess : cuda_emu::fail_with(cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
// What bench/schedules_cuda.cu asks of the runtime besides the kernels' calls (its test runs it
// here): a stream (every call completes before it returns, so one stream is as good as another),
// the device's properties, a kernel's registers and blocks per SM (none measured here: zeros, and
// as many blocks as 2048 threads make).
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  static char streams[64];
  static std::atomic<int> next{0};
  *stream = reinterpret_cast<cudaStream_t>(streams + next++ % 64);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= cuda_emu::kDevices) return cuda_emu::fail_with(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::strncpy(prop->name, "CUDA emulator", sizeof(prop->name) - 1);
  prop->major = 9;
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void*) {
  *attr = cudaFuncAttributes{};
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void*, int block_size, size_t) {
  *blocks = block_size > 0 ? 2048 / block_size : 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= cuda_emu::kDevices) return cuda_emu::fail_with(cudaErrorInvalidDevice);
  if (attr != cudaDevAttrComputeCapabilityMajor) return cuda_emu::fail_with(cudaErrorInvalidValue);
  *value = 9;  // as __CUDA_ARCH__ reads 900 here
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  cuda_emu::record_stream_use("cudaMemsetAsync", stream);
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) { return cudaMemsetAsync(p, value, bytes, nullptr); }
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t stream) {
  cuda_emu::record_stream_use("cudaMemcpyAsync", stream);
  if (bytes && cuda_emu::on_device(src) && !cuda_emu::on_device(dst)) {  // lands at the next synchronize
    cuda_emu::refuse_while_capturing("cudaMemcpyAsync into host memory");  // a graph would copy at replay only
    const char* from = static_cast<const char*>(src);
    cuda_emu::pending_copies.push_back({dst, std::vector<char>(from, from + bytes), cuda_emu::copies_queued++});
    return cudaSuccess;
  }
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {  // synchronous
  cuda_emu::record_stream_use("cudaMemcpy", nullptr);
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  *status = stream && stream == cuda_emu::capturing.load() ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  cuda_emu::record_stream_use("cudaStreamSynchronize", stream);
  cuda_emu::refuse_while_capturing("cudaStreamSynchronize");
  cuda_emu::land_copies();
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  cuda_emu::record_stream_use("cudaDeviceSynchronize", nullptr);
  cuda_emu::refuse_while_capturing("cudaDeviceSynchronize");
  cuda_emu::land_copies();
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = cuda_emu::current;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= cuda_emu::kDevices) return cuda_emu::fail_with(cudaErrorInvalidDevice);
  cuda_emu::current = device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* count) {
  *count = cuda_emu::kDevices;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  *event = new CUevent_st{cuda_emu::current};
  std::lock_guard lock(cuda_emu::event_mutex);
  cuda_emu::events().insert(*event);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  cuda_emu::record_stream_use("cudaEventRecord", stream);
  // On the GPU: an error (a stream of another device than the event's).
  CUevent_st* e = cuda_emu::live_event(event, "cudaEventRecord");
  if (e->device != cuda_emu::current) return cuda_emu::fail_with(cudaErrorInvalidResourceHandle);
  e->recorded = std::chrono::steady_clock::now();
  e->stream = stream;
  e->copies_before = cuda_emu::copies_queued;
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  const auto from = cuda_emu::live_event(start, "cudaEventElapsedTime")->recorded;
  const auto to = cuda_emu::live_event(end, "cudaEventElapsedTime")->recorded;
  *ms = std::chrono::duration<float, std::milli>(to - from).count();
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  cuda_emu::record_stream_use("cudaStreamWaitEvent", stream);
  cuda_emu::live_event(event, "cudaStreamWaitEvent");
  return cudaSuccess;
}
// Waits for the work queued before the event's record: only the copies into host memory queued
// before it land. Recorded as a use of the stream the event was recorded on.
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  CUevent_st* e = cuda_emu::live_event(event, "cudaEventSynchronize");
  cuda_emu::record_stream_use("cudaEventSynchronize", e->stream);
  cuda_emu::refuse_while_capturing("cudaEventSynchronize");
  cuda_emu::land_copies(e->copies_before);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  CUevent_st* gone = cuda_emu::live_event(event, "cudaEventDestroy");
  {
    std::lock_guard lock(cuda_emu::event_mutex);
    cuda_emu::events().erase(gone);
  }
  delete gone;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  cuda_emu::unchecked_launch.clear();
  return std::exchange(cuda_emu::last_error, cudaSuccess);
}
cudaError_t cudaPeekAtLastError() {
  cuda_emu::unchecked_launch.clear();
  return cuda_emu::last_error;
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    default: return "unknown error (emulated)";
  }
}

}  // extern "C"
