// The CUDA backend. Compiled only when nvcc is found; at run time it reports itself
// unavailable (with the driver's reason) on machines without a GPU, and never aborts.
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>

#include "opforge/backend.h"
#include "opforge/cuda/scratch.h"
#include "opforge/error.h"

// The host CUDA emulator's tests compile this file as their emulated device's backend, under
// the name their rewritten kernels register with.
#ifndef OPFORGE_CUDA_BACKEND_NAME
#define OPFORGE_CUDA_BACKEND_NAME "cuda"
#endif

namespace opforge {

namespace cuda {
namespace {

// opforge's memory pool on `device`, made at its first use with kPoolKeepBytes as its release
// threshold; nullptr where the device cannot make one (the runtime's default pool then).
cudaMemPool_t pool_of(int device) {
  static std::mutex mutex;
  static auto* pools = new std::map<int, cudaMemPool_t>;  // never destroyed: the runtime may be gone at exit
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = pools->emplace(device, nullptr);
  if (!fresh) return it->second;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  uint64_t keep = kPoolKeepBytes;
  if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess)
    cudaGetLastError();  // a pool that keeps nothing still allocates
  return it->second = pool;
}

}  // namespace

cudaError_t pool_allocate(void** p, size_t bytes, cudaStream_t stream) {
  *p = nullptr;
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess) {
    const cudaMemPool_t pool = pool_of(device);
    const size_t n = bytes ? bytes : 1;
    status = pool ? cudaMallocFromPoolAsync(p, n, pool, stream) : cudaMallocAsync(p, n, stream);
  }
  if (status != cudaSuccess) {
    cudaGetLastError();
    *p = nullptr;
  }
  return status;
}

void pool_release(void* p, cudaStream_t stream) noexcept {
  if (p && cudaFreeAsync(p, stream) != cudaSuccess) cudaGetLastError();
}

}  // namespace cuda

namespace {

// A failed call's status is also the runtime's last error until someone reads it: it is reported
// here, so it is cleared, or the next op's launch check would report it as its own.
void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  fail(ErrorKind::runtime, "cuda backend: ", what, " failed: ", cudaGetErrorString(status));
}

// Makes `index` the calling thread's current device; returns the one it replaces.
int exchange(int index) {
  int previous = 0;
  check(cudaGetDevice(&previous), "cudaGetDevice");
  if (previous != index) check(cudaSetDevice(index), "cudaSetDevice");
  return previous;
}

class CudaBackend final : public Backend {
 public:
  std::string name() const override { return OPFORGE_CUDA_BACKEND_NAME; }
  DeviceType device_type() const override { return DeviceType::cuda; }

  bool available() const override { return device_count() > 0; }
  std::string unavailable_reason() const override {
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    if (status != cudaSuccess) return str("no CUDA device (", cudaGetErrorString(status), ")");
    return count == 0 ? "no CUDA device" : "";
  }
  int score() const override { return 20; }
  int64_t device_count() const override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return count;
  }

  int32_t current_device() const override {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    return device;
  }
  int32_t exchange_device(int32_t index) override { return exchange(index); }

  // From opforge's pool (opforge/cuda/scratch.h), which keeps memory across synchronizations.
  void* allocate(int64_t bytes, Device device, void* stream) override {
    OnDevice scope(device.index);
    void* p = nullptr;
    check(cuda::pool_allocate(&p, size_t(bytes), static_cast<cudaStream_t>(stream)), "allocating from its pool");
    return p;
  }
  void* fence(Device device, void* stream) override {
    OnDevice scope(device.index);
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    const cudaError_t status = cudaEventRecord(event, static_cast<cudaStream_t>(stream));
    if (status != cudaSuccess) cudaEventDestroy(event);
    check(status, "cudaEventRecord");
    return event;
  }
  // cudaFree does not wait for stream-ordered memory: the free is queued on this thread's
  // default stream behind the fence, not on the caller's stream, which may be gone by now (a
  // CuPy stream outlived by its results). Errors cannot be reported from here.
  void release(void* ptr, Device device, void* fence) noexcept override {
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess || (previous != device.index && cudaSetDevice(device.index) != cudaSuccess)) {
      cudaGetLastError();
      return;  // leaked: no context to free it in
    }
    if (fence) {
      cudaStreamWaitEvent(cudaStreamPerThread, static_cast<cudaEvent_t>(fence), 0);
      cudaEventDestroy(static_cast<cudaEvent_t>(fence));  // released once the wait is done
    }
    cudaFreeAsync(ptr, cudaStreamPerThread);
    if (previous != device.index) cudaSetDevice(previous);
    cudaGetLastError();
  }
  void copy(void* dst, const void* src, int64_t bytes, void* stream) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
          "cudaMemcpyAsync");
  }
  void synchronize(Device device, void* stream) override {
    OnDevice scope(device.index);
    check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
  }

 private:
  // `index` current for the scope, the caller's device restored after (torch and CuPy read the
  // current device as theirs: a call must not move it).
  class OnDevice {
   public:
    explicit OnDevice(int index) : previous_(exchange(index)), index_(index) {}
    ~OnDevice() {
      if (previous_ != index_) cudaSetDevice(previous_);
    }
    OnDevice(const OnDevice&) = delete;
    OnDevice& operator=(const OnDevice&) = delete;

   private:
    int previous_ = 0;
    int index_ = 0;
  };
};

struct Registrar {
  Registrar() { register_backend(std::make_unique<CudaBackend>()); }
} registrar;

}  // namespace

}  // namespace opforge
