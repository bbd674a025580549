// The CUDA backend. Compiled only when nvcc is found; at run time it reports itself
// unavailable (with the driver's reason) on machines without a GPU, and never aborts.
#include <cuda_runtime.h>

#include <memory>

#include "opforge/backend.h"
#include "opforge/error.h"

namespace opforge {

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    fail(ErrorKind::runtime, "cuda backend: ", what, " failed: ", cudaGetErrorString(status));
}

class CudaBackend final : public Backend {
 public:
  std::string name() const override { return "cuda"; }
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

  void* allocate(int64_t bytes, Device device, void* stream) override {
    check(cudaSetDevice(device.index), "cudaSetDevice");
    void* p = nullptr;
    check(cudaMallocAsync(&p, bytes ? bytes : 1, static_cast<cudaStream_t>(stream)), "cudaMallocAsync");
    return p;
  }
  void release(void* ptr, Device device) override {
    cudaSetDevice(device.index);
    cudaFree(ptr);  // synchronizes; safe whichever stream last used the memory
  }
  void copy(void* dst, const void* src, int64_t bytes, void* stream) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
          "cudaMemcpyAsync");
  }
  void synchronize(Device device, void* stream) override {
    check(cudaSetDevice(device.index), "cudaSetDevice");
    check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
  }
};

struct Registrar {
  Registrar() { register_backend(std::make_unique<CudaBackend>()); }
} registrar;

}  // namespace

}  // namespace opforge
