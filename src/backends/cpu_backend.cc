// The CPU backend: always available, 64-byte aligned host memory.
#include <cstdlib>
#include <cstring>
#include <memory>

#include "opforge/backend.h"
#include "opforge/error.h"

namespace opforge {

namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  DeviceType device_type() const override { return DeviceType::cpu; }
  bool available() const override { return true; }
  int score() const override { return 10; }
  int64_t device_count() const override { return 1; }

  void* allocate(int64_t bytes, Device, void*) override {
    // Round up so aligned_alloc's size rule holds; never return null for empty tensors.
    const size_t size = (static_cast<size_t>(bytes) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, size ? size : 64);
    if (!p) fail(ErrorKind::runtime, "cpu backend: out of memory allocating ", bytes, " bytes");
    return p;
  }
  void release(void* ptr, Device) override { std::free(ptr); }
  void copy(void* dst, const void* src, int64_t bytes, void*) override {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void synchronize(Device, void*) override {}
};

struct Registrar {
  Registrar() { register_backend(std::make_unique<CpuBackend>()); }
} registrar;

}  // namespace

}  // namespace opforge
