// The int8 tensor-core product one warp computes: D (16 x 8, int32) = A (16 x 32, int8) B (32 x 8,
// int8), exact (int32 sums of int8 products cannot overflow at k = 32). On the GPU it is the PTX
// instruction mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 (sm_80 and later); in the CUDA
// emulator, where there is no such instruction, the same product through shuffles, written from
// the fragment layout the PTX ISA documents ("Matrix Fragments for mma.m16n8k32", .s8), so the
// emulator checks that a kernel puts each value where the instruction expects it. With
// g = lane / 4 and t = lane % 4 (the ISA's groupID and threadID_in_group):
//   a[r]: four consecutive int8 of A's row g + 8 * (r & 1), columns 4 t + 16 * (r >> 1) + 0..3
//   b[r]: four consecutive int8 of B's column g, rows 4 t + 16 r + 0..3
//   d[r]: D's row g + 8 * (r >> 1), column 2 t + (r & 1)
// (each register's low byte is the lowest column or row).
#pragma once

#include <cstdint>

namespace opforge::cuda {

#ifdef CUDA_EMU_ARCH
// The emulated instruction's products: four int8 pairs of a and b.
__device__ __forceinline__ int32_t dot4_s8(uint32_t a, uint32_t b) {
  int32_t s = 0;
  for (int i = 0; i < 4; ++i) s += int32_t(int8_t(a >> (8 * i))) * int32_t(int8_t(b >> (8 * i)));
  return s;
}
#endif

// d = a b for the whole warp (every lane calls it, converged).
__device__ __forceinline__ void mma_s8_16x8x32(int32_t (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifndef CUDA_EMU_ARCH
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0));
#else
  const unsigned lane = threadIdx.x % 32, group = lane & ~3u, t = lane % 4;
  for (int r = 0; r < 4; ++r) d[r] = 0;
  // Lane (g, j) holds A's rows g and g + 8 at columns 4 j + 16 h (a[h * 2 + upper]) and B's column
  // g at rows 4 j + 16 h (b[h]); this lane needs rows g, g + 8 (its group's) and columns 2 t, 2 t + 1.
  for (unsigned j = 0; j < 4; ++j) {
    for (int h = 0; h < 2; ++h) {
      const uint32_t row_lo = __shfl_sync(0xffffffffu, a[2 * h], int(group + j));
      const uint32_t row_hi = __shfl_sync(0xffffffffu, a[2 * h + 1], int(group + j));
      const uint32_t col0 = __shfl_sync(0xffffffffu, b[h], int(4 * (2 * t) + j));
      const uint32_t col1 = __shfl_sync(0xffffffffu, b[h], int(4 * (2 * t + 1) + j));
      d[0] += dot4_s8(row_lo, col0);
      d[1] += dot4_s8(row_lo, col1);
      d[2] += dot4_s8(row_hi, col0);
      d[3] += dot4_s8(row_hi, col1);
    }
  }
#endif
}

}  // namespace opforge::cuda
