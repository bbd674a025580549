// Target bookkeeping over Highway's dynamic dispatch. HWY_TARGETS here equals the set every
// kernel file is compiled for: CMake passes the same definitions to all of them.
#include "opforge/simd.h"

#include <hwy/highway.h>
#include <hwy/targets.h>

#include <atomic>
#include <cstdlib>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#include "opforge/error.h"
#include "environment.h"

namespace opforge {

namespace {
std::vector<int64_t> bits_of(int64_t mask) {
  std::vector<int64_t> out;
  for (int64_t m = mask; m != 0; m &= m - 1) out.push_back(m & ~(m - 1));
  return out;  // lowest bit first = best target first in Highway's numbering
}

struct EnvironmentPin {
  EnvironmentPin() {
    // A bad OPFORGE_SIMD must not abort the load; it is reported by opforge info instead.
    if (const char* env = std::getenv("OPFORGE_SIMD"); env && *env) {
      try {
        set_simd_target(env);
      } catch (const Error&) {
      }
    }
  }
};
}  // namespace

std::vector<std::string> simd_targets_compiled() {
  std::vector<std::string> out;
  for (int64_t t : bits_of(HWY_TARGETS)) out.emplace_back(hwy::TargetName(t));
  return out;
}

namespace {
int64_t pinned = 0;  // 0: automatic choice

// Targets this CPU runs that were compiled, ignoring (but keeping) the pin.
int64_t supported_mask() {
  hwy::SetSupportedTargetsForTest(0);
  const int64_t mask = hwy::SupportedTargets() & HWY_TARGETS;
  hwy::SetSupportedTargetsForTest(pinned);
  return mask;
}
}  // namespace

std::vector<std::string> simd_targets_supported() {
  std::vector<std::string> out;
  for (int64_t t : bits_of(supported_mask())) out.emplace_back(hwy::TargetName(t));
  return out;
}

std::string simd_target_chosen() {
  const int64_t mask = pinned ? pinned : supported_mask();
  return hwy::TargetName(mask & ~(mask - 1));
}

void set_simd_target(const std::string& name) {
  for (int64_t t : bits_of(supported_mask())) {
    if (name.empty() || name == hwy::TargetName(t)) {
      pinned = name.empty() ? 0 : t;
      hwy::SetSupportedTargetsForTest(pinned);
      return;
    }
  }
  std::string supported;
  for (const auto& s : simd_targets_supported()) supported += (supported.empty() ? "" : ", ") + s;
  fail(ErrorKind::value, "set_simd_target(): 'name' must be one of the targets this CPU supports [",
       supported, "], got '", name, "'");
}

static EnvironmentPin environment_pin;

namespace {
bool detect_avx512_bf16() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned eax, ebx, ecx, edx;
  // CPUID leaf 7, subleaf 1, EAX bit 5: AVX512_BF16. The AVX-512 state the OS must save is
  // Highway's check before it picks an AVX-512 target, the only code that reads this.
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5));
#else
  return false;
#endif
}

std::atomic<bool> bf16_dot_on{detect_avx512_bf16() && !turned_off_by_environment("OPFORGE_BF16_DOT")};

std::atomic<bool> bf16_grad_rounding_on{turned_on_by_environment("OPFORGE_BF16_GRAD_ROUNDING")};
}  // namespace

bool bf16_convert_supported() {
  static const bool supported = detect_avx512_bf16();
  return supported;
}

namespace detail {
bool bf16_convert_on = bf16_convert_supported() && !turned_off_by_environment("OPFORGE_BF16_CONVERT");
}  // namespace detail

bool bf16_convert_enabled() { return detail::bf16_convert_on; }

void set_bf16_convert_enabled(bool enabled) { detail::bf16_convert_on = enabled && bf16_convert_supported(); }

bool bf16_dot_supported() { return bf16_convert_supported(); }  // one CPU feature: AVX512_BF16
bool bf16_dot_enabled() { return bf16_dot_on.load(std::memory_order_relaxed); }
void set_bf16_dot_enabled(bool enabled) { bf16_dot_on = enabled && bf16_dot_supported(); }

bool bf16_grad_rounding_enabled() { return bf16_grad_rounding_on.load(std::memory_order_relaxed); }
void set_bf16_grad_rounding_enabled(bool enabled) { bf16_grad_rounding_on = enabled; }

}  // namespace opforge
