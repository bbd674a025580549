// A backend is a small table: where it runs, whether it can run here and how much it
// wants to, and the memory and stream primitives the callers need. CPU and CUDA are
// backends; a device plugin adds one more by registering it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "opforge/device.h"

namespace opforge {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual DeviceType device_type() const = 0;
  virtual bool available() const = 0;
  // Why available() is false ("no CUDA device: ..."), for listings and error messages.
  virtual std::string unavailable_reason() const { return {}; }
  // Higher wins when several available backends have a kernel for the same device.
  virtual int score() const = 0;
  virtual int64_t device_count() const = 0;
  // The device the calling thread has made current (CUDA's cudaGetDevice); 0 where there is one.
  virtual int32_t current_device() const { return 0; }

  // Makes `index` the calling thread's current device (where CUDA launches and allocates) and
  // returns the one it replaces; a no-op where the backend has one device.
  virtual int32_t exchange_device(int32_t index) { return index; }

  // Memory on `device`, ordered on `stream` where the backend has streams.
  virtual void* allocate(int64_t bytes, Device device, void* stream) = 0;
  // A marker of the work queued on `stream` so far (CUDA: an event) for release(); nullptr
  // where the backend has no streams.
  virtual void* fence(Device /*device*/, void* /*stream*/) { return nullptr; }
  // Frees memory from allocate() once the work `fence` marks has finished (nullptr: none
  // pending), without waiting for it here. Never throws: it runs from destructors.
  virtual void release(void* ptr, Device device, void* fence) noexcept = 0;
  virtual void copy(void* dst, const void* src, int64_t bytes, void* stream) = 0;
  virtual void synchronize(Device device, void* stream) = 0;
};

void register_backend(std::unique_ptr<Backend> backend);
std::vector<Backend*> all_backends();
Backend* lookup_backend(const std::string& name);

}  // namespace opforge
