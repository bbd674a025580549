// Ahead: the prefetching that linear_act's product tiles spread over their steps.
#pragma once

#include <hwy/cache_control.h>

#include <cstdint>

namespace opforge::gemm {

// Bytes to bring into the caches in memory order while a tile runs (matmul-inl.h's DotTile,
// gemm-inl.h's Tile, pair_tile-inl.h's PairTile): `lines` 64-byte lines from `at` on, spread over
// its steps along p. The tiles read several rows of a big operand side by side, streams the
// hardware prefetchers follow poorly from DRAM; the next tile's rows, one after another in
// memory, are one stream.
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

}  // namespace opforge::gemm
