// The functions opforge.forge calls through ctypes. Plain C: no pybind11 or nanobind module,
// so this library needs nothing from torch_python and Python loads it with the same
// torch.ops.load_library call that registers its kernels. Each returns a status (or a value,
// negative on failure); the failure's message is forge_last_error() on the same thread.
#include <ATen/ATen.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "generator.h"
#include "runtime.h"

#define FORGE_EXPORT extern "C" __attribute__((visibility("default")))

namespace opforge::forge {
std::string& op_registration_errors();
const char* register_new_ops();

namespace {
thread_local std::string last_error;
thread_local std::string text_result;

template <typename F>
auto guarded(F f, decltype(f()) on_error) {
  try {
    return f();
  } catch (const c10::Error& e) {
    last_error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    last_error = e.what();
  }
  return on_error;
}
}  // namespace
}  // namespace opforge::forge

using namespace opforge::forge;

FORGE_EXPORT const char* forge_last_error() { return last_error.c_str(); }
FORGE_EXPORT const char* forge_registration_errors() { return op_registration_errors().c_str(); }
// The forge kernels of ops a plugin added since (opforge.load_plugin); "" or this call's problems.
FORGE_EXPORT const char* forge_register_new_ops() { return register_new_ops(); }
FORGE_EXPORT const char* forge_torch_version() { return OPFORGE_FORGE_TORCH_VERSION; }
FORGE_EXPORT int forge_device_count() { return device_count(); }
FORGE_EXPORT const char* forge_init_error() { return init_error().c_str(); }

FORGE_EXPORT int forge_init() {
  return guarded([] { ensure_initialized(); return 0; }, -1);
}

FORGE_EXPORT int forge_current_device() {
  return guarded([] { ensure_initialized(); return current_device(); }, -1);
}

FORGE_EXPORT int forge_set_device(int64_t device) {
  return guarded([=] { set_current_device(static_cast<int>(device)); return 0; }, -1);
}

FORGE_EXPORT int forge_synchronize(int64_t device) {
  return guarded([=] { synchronize_device(static_cast<int>(device)); return 0; }, -1);
}

// which: 0 allocated bytes, 1 reserved bytes, 2 peak allocated, 3 peak reserved, 4 requested
// bytes, 5 live allocations, 6 segments (mapped blocks, in use or cached).
FORGE_EXPORT int64_t forge_memory_stat(int64_t device, int which) {
  return guarded(
      [=]() -> int64_t {
        const auto s = allocator().getDeviceStats(static_cast<c10::DeviceIndex>(device));
        switch (which) {
          case 0: return s.allocated_bytes[0].current;
          case 1: return s.reserved_bytes[0].current;
          case 2: return s.allocated_bytes[0].peak;
          case 3: return s.reserved_bytes[0].peak;
          case 4: return s.requested_bytes[0].current;
          case 5: return s.allocation[0].current;
          case 6: return s.segment[0].current;
        }
        TORCH_CHECK(false, "forge_memory_stat: unknown statistic ", which);
      },
      int64_t{-1});
}

FORGE_EXPORT int forge_reset_peak(int64_t device) {
  return guarded([=] { allocator().resetPeakStats(static_cast<c10::DeviceIndex>(device)); return 0; }, -1);
}

FORGE_EXPORT void forge_empty_cache() { allocator().emptyCache(); }
FORGE_EXPORT void forge_set_caching(int on) { allocator().set_caching(on != 0); }
FORGE_EXPORT int forge_caching() { return allocator().caching(); }
FORGE_EXPORT int forge_protection() { return protection_enabled(); }

FORGE_EXPORT void forge_set_fallback_mode(int mode) { set_fallback_mode(static_cast<FallbackMode>(mode != 0)); }
FORGE_EXPORT int forge_fallback_mode() { return static_cast<int>(fallback_mode()); }
FORGE_EXPORT void forge_clear_fallback_ops() { clear_fallback_counts(); }

// "name count" lines.
FORGE_EXPORT const char* forge_fallback_ops() {
  text_result.clear();
  for (const auto& [name, count] : fallback_counts()) text_result += name + " " + std::to_string(count) + "\n";
  return text_result.c_str();
}

FORGE_EXPORT int forge_manual_seed(int64_t device, uint64_t seed) {
  return guarded([=] { const_cast<at::Generator&>(default_generator(static_cast<int>(device))).set_current_seed(seed); return 0; }, -1);
}

FORGE_EXPORT int forge_seed(int64_t device) {
  return guarded([=] { const_cast<at::Generator&>(default_generator(static_cast<int>(device))).seed(); return 0; }, -1);
}

FORGE_EXPORT int forge_initial_seed(int64_t device, uint64_t* out) {
  return guarded([=] { *out = default_generator(static_cast<int>(device)).current_seed(); return 0; }, -1);
}

// Queues a pause on the current stream of the current device: a deliberately slow task, for
// tests and benchmarks of stream ordering.
FORGE_EXPORT int forge_sleep(double seconds) {
  return guarded(
      [=] {
        current_stream(current_device()).enqueue([seconds] {
          std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
        });
        return 0;
      },
      -1);
}

FORGE_EXPORT int64_t forge_current_stream_id(int64_t device) {
  return guarded([=] { return current_stream(static_cast<int>(device)).id(); }, int64_t{-1});
}

FORGE_EXPORT int forge_set_stream(int64_t device, int64_t id) {
  return guarded([=] { set_current_stream(static_cast<int>(device), id); return 0; }, -1);
}

FORGE_EXPORT int forge_device_type() { return static_cast<int>(c10::DeviceType::PrivateUse1); }

// The default generator's state (the CPU engine's byte layout): its size, copied into `out`
// when that holds `capacity` bytes or more.
FORGE_EXPORT int64_t forge_rng_state(int64_t device, uint8_t* out, int64_t capacity) {
  return guarded(
      [=]() -> int64_t {
        const at::Tensor state = default_generator(static_cast<int>(device)).get_state();
        const int64_t n = state.numel();
        if (out && capacity >= n) std::memcpy(out, state.data_ptr(), n);
        return n;
      },
      int64_t{-1});
}

FORGE_EXPORT int forge_set_rng_state(int64_t device, const uint8_t* data, int64_t size) {
  return guarded(
      [=] {
        const at::Tensor state = at::from_blob(const_cast<uint8_t*>(data), {size}, at::kByte).clone();
        const_cast<at::Generator&>(default_generator(static_cast<int>(device))).set_state(state);
        return 0;
      },
      -1);
}
