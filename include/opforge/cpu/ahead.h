// Ahead: prefetching spread over the steps of a kernel that reads several rows of a big operand
// side by side (linear_act's product tiles, matmul_q's weight tiles). Those are separate streams
// that the hardware prefetchers follow poorly from DRAM, while the rows of the next tile lie one
// after another in memory: one stream, brought in here a share per step.
#pragma once

#include <hwy/cache_control.h>

#include <cstdint>

namespace opforge::cpu {

// `lines` 64-byte lines from `at` on, issued a few per step.
struct Ahead {
  const char* at = nullptr;
  int64_t lines = 0;

  // Lines per step over `steps` steps, rounded up so that the last goes out before the last step.
  int64_t PerStep(int64_t steps) const { return steps > 0 ? (lines + steps - 1) / steps : 0; }
  // Prefetches the next `count` lines, none at or past `end`.
  HWY_INLINE void Issue(int64_t count, const char* end) {
    for (int64_t l = 0; l < count && at < end; ++l, at += 64) hwy::Prefetch(at);
  }
};

}  // namespace opforge::cpu
