// Whether this process may use Intel AMX, and the switch that turns it off. The tile data
// (8 KiB per thread) is a dynamically enabled XSAVE feature on Linux: a process must ask for it
// (arch_prctl ARCH_REQ_XCOMP_PERM) before its first tile instruction, or that faults (SIGILL).
#include <atomic>
#include <cstdlib>

#include "opforge/simd.h"
#include "environment.h"

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace opforge {

namespace {

#if defined(__x86_64__) && defined(__linux__)
bool detect() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27))) return false;  // OSXSAVE
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  constexpr unsigned kAmxBf16 = 1u << 22, kAmxTile = 1u << 24;
  if ((edx & (kAmxBf16 | kAmxTile)) != (kAmxBf16 | kAmxTile)) return false;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  constexpr unsigned kTileState = (1u << 17) | (1u << 18);  // XTILECFG, XTILEDATA
  if ((lo & kTileState) != kTileState) return false;
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}
#else
bool detect() { return false; }
#endif

std::atomic<bool> turned_off{turned_off_by_environment("OPFORGE_AMX")};

}  // namespace

bool amx_supported() {
  static const bool supported = detect();
  return supported;
}

bool amx_enabled() { return !turned_off.load(std::memory_order_relaxed) && amx_supported(); }

void set_amx_enabled(bool enabled) { turned_off = !enabled; }

}  // namespace opforge
