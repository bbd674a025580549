// linear_act's bfloat16 product on AMX tiles. Eight tile registers of 16 rows x 64 bytes: four
// hold a 32 x 32 block of float32 sums, two a 32 x 32 slice of Q (rows q, 32 values of k) and
// two the matching slice of P, stored pairwise ("VNNI" layout: row j of a tile holds k = 2j and
// 2j + 1 of 16 P rows), so that one TDPBF16PS adds 16 x 16 x 32 products.
//
// Blocking: P is packed once into 16-row panels of that layout (zero-padded to whole tiles in
// both directions). A task owns kRange rows of P and a chunk of Q's rows; it walks K in blocks
// of kKc, its P slice (kRange x kKc, 512 KiB) staying in L2 while each 32-row slice of Q
// (32 KiB, copied and zero-padded, so edges need no masking) is in L1 for the whole range.
// Reading Q's tiles in place instead ran at half the speed on one core (one run): Q's rows lie
// a power of two apart in the usual shapes and evict each other from L1. Partial sums wait in
// the task's scratch between K blocks; the last block hands them on.
#include "ops/linear_act/amx_bf16.h"

#if defined(__x86_64__) && defined(__linux__)
#include <hwy/aligned_allocator.h>
#include <hwy/base.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "opforge/cpu/scratch.h"
#include "opforge/parallel.h"
#include "ops/linear_act/amx_transpose.h"

namespace opforge::linear_act::amx {

namespace {

constexpr int64_t kPanel = 16;     // P rows per packed panel (one tile's columns)
constexpr int64_t kStep = 32;      // k per tile instruction
constexpr int64_t kKc = 512;       // k per block
constexpr int64_t kRange = 512;    // P rows per task
constexpr int64_t kLd = kBlock;    // floats per row of a block of sums

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Rows q0..q0 + kBlock of Q over k0..k0 + kc, as kBlock rows of ld values, zero-padded.
void copy_q_slice(const Bf16Operand& Q, int64_t q0, int64_t k0, int64_t kc, uint16_t* buf, int64_t ld) {
  const int64_t rows = std::min(kBlock, Q.rows - q0);
  for (int64_t i = 0; i < kBlock; ++i) {
    uint16_t* dst = buf + i * ld;
    if (i >= rows) {
      std::memset(dst, 0, ld * sizeof(uint16_t));
      continue;
    }
    const uint16_t* src = Q.data + (q0 + i) * Q.rs + (k0 >> Q.shift) * Q.ps;
    if (Q.ps == 1 && Q.shift == 0) {
      std::memcpy(dst, src, kc * sizeof(uint16_t));
    } else {
      for (int64_t k = 0; k < kc; ++k) dst[k] = src[(k >> Q.shift) * Q.ps];
    }
    std::memset(dst + kc, 0, (ld - kc) * sizeof(uint16_t));
  }
}

HWY_PUSH_ATTRIBUTES("amx-tile,amx-bf16,avx512f,avx512bw")

// dst[2i] = dst[2i + 1] = src[i] for i < 16: one tile row of a doubled operand.
void pack_doubled(const uint16_t* src, uint16_t* dst) {
  const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  _mm512_storeu_si512(dst, _mm512_or_si512(v, _mm512_slli_epi32(v, 16)));
}

// out[j * kLd + i] = sums[i * kLd + j] for a kBlock x kBlock block, quadrant by quadrant.
void turn_block(const float* sums, float* out) {
  for (int64_t qi = 0; qi < kBlock; qi += 16) {
    for (int64_t qj = 0; qj < kBlock; qj += 16) {
      const void* rows[16];
      for (int64_t i = 0; i < 16; ++i) rows[i] = sums + (qi + i) * kLd + qj;
      transpose_16x16(rows, reinterpret_cast<char*>(out + qj * kLd + qi), kLd * sizeof(float));
    }
  }
}

// P's rows in panels of kPanel, K block by K block: block b (k from b * kKc) holds every panel's
// [k / 2][row][k % 2] over that block's k (rounded up to kStep), zeros past the end; panels
// rounded up to an even count (tiles go in pairs). One K block's slice is contiguous: with
// whole panels one after another instead, the slice's pieces lay a power of two apart and
// fought over the same L2 sets (a third of the speed at K = 4096).
void pack_panels(const Bf16Operand& P, int64_t K, int64_t panels, uint16_t* packed) {
  const int64_t blocks = (K + kKc - 1) / kKc, items = panels * blocks;
  parallel_for(items, std::max<int64_t>(1, (1 << 16) / (kPanel * kKc)), [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t block = item / panels, panel = item % panels, k0 = block * kKc;
      const int64_t kc = std::min(kKc, K - k0), panel_size = round_up(kc, kStep) * kPanel;
      uint16_t* dst = packed + k0 * panels * kPanel + panel * panel_size;
      std::memset(dst, 0, panel_size * sizeof(uint16_t));
      const int64_t r0 = panel * kPanel, rows = std::clamp<int64_t>(P.rows - r0, 0, kPanel);
      int64_t whole = 0;  // k packed by whole tiles
      if (P.ps == 1 && P.shift == 0 && rows == kPanel) {
        for (; whole + kStep <= kc; whole += kStep) {
          const void* src[kPanel];
          for (int64_t i = 0; i < kPanel; ++i) src[i] = P.data + (r0 + i) * P.rs + k0 + whole;
          transpose_16x16(src, reinterpret_cast<char*>(dst + whole * kPanel), 64);
        }
      } else if (P.rs == 1 && P.shift == 1 && rows == kPanel) {
        // Pair j of every row is one value twice: tile row j is 16 adjacent values, doubled.
        for (int64_t j = 0; 2 * j < kc; ++j) pack_doubled(P.data + r0 + (k0 / 2 + j) * P.ps, dst + 2 * j * kPanel);
        whole = kc;
      }
      for (int64_t i = 0; i < rows; ++i) {
        const uint16_t* src = P.data + (r0 + i) * P.rs + (k0 >> P.shift) * P.ps;
        uint16_t* out = dst + 2 * i;
        if (P.ps == 1 && P.shift == 0) {
          for (int64_t k = whole; k + 1 < kc; k += 2) std::memcpy(out + k * kPanel, src + k, 4);
          if (kc % 2) out[(kc - 1) * kPanel] = src[kc - 1];
        } else {
          for (int64_t k = whole; k < kc; ++k) out[(k / 2) * 2 * kPanel + k % 2] = src[(k >> P.shift) * P.ps];
        }
      }
    }
  });
}

void configure_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  // Not _tile_loadconfig: GCC 12 declares its memory operand as the first 8 bytes only, and then
  // drops the stores to the rest as dead (the tiles stay unconfigured: SIGILL at the first use).
  __asm__ volatile("ldtilecfg %0" : : "m"(config));
}

// sums (kBlock x kLd floats) (+)= q_rows (kBlock rows, q_ld values apart) x two panels over kc
// (a multiple of kStep) values of k.
void block_product(const uint16_t* q_rows, int64_t q_ld, const uint16_t* panel0, const uint16_t* panel1, int64_t kc,
                   float* sums, bool accumulate) {
  constexpr int64_t kRowBytes = kLd * sizeof(float);
  if (accumulate) {
    _tile_loadd(0, sums, kRowBytes);
    _tile_loadd(1, sums + 16, kRowBytes);
    _tile_loadd(2, sums + 16 * kLd, kRowBytes);
    _tile_loadd(3, sums + 16 * kLd + 16, kRowBytes);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t q_stride = q_ld * sizeof(uint16_t);
  for (int64_t k = 0; k < kc; k += kStep) {
    // Each product as soon as its tiles are in (4% faster than all loads first on one core).
    _tile_loadd(4, q_rows + k, q_stride);
    _tile_loadd(6, panel0 + k * kPanel, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, panel1 + k * kPanel, 64);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, q_rows + 16 * q_ld + k, q_stride);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    // The panels stream from L2; the next step's 2 KiB asked for now. Measured: +15-20% on one
    // core while this shared machine's neighbours loaded its memory system, no change otherwise.
    for (int line = 0; line < 16; ++line) {
      _mm_prefetch(reinterpret_cast<const char*>(panel0 + (k + kStep) * kPanel) + line * 64, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(panel1 + (k + kStep) * kPanel) + line * 64, _MM_HINT_T0);
    }
  }
  _tile_stored(0, sums, kRowBytes);
  _tile_stored(1, sums + 16, kRowBytes);
  _tile_stored(2, sums + 16 * kLd, kRowBytes);
  _tile_stored(3, sums + 16 * kLd + 16, kRowBytes);
}

void release_tiles() { _tile_release(); }

HWY_POP_ATTRIBUTES

}  // namespace

void gemm(const Bf16Operand& P, const Bf16Operand& Q, int64_t K, bool p_rows, const BlockSink& sink) {
  const int64_t panels = round_up((P.rows + kPanel - 1) / kPanel, 2);
  const cpu::BackendBuffer<uint16_t> packed(panels * kPanel * round_up(K, kStep));
  pack_panels(P, K, panels, packed.get());

  const int64_t ranges = (P.rows + kRange - 1) / kRange;
  // Q rows per task: whole blocks, few enough that every thread gets several tasks.
  int64_t nc = 8 * kBlock;
  while (nc > kBlock && ranges * ((Q.rows + nc - 1) / nc) < 4 * num_threads()) nc /= 2;
  const int64_t chunks = (Q.rows + nc - 1) / nc;
  parallel_for(ranges * chunks, 1, [&](int64_t begin, int64_t end) {
    uint16_t* q_slice = cpu::thread_scratch<uint16_t>(kBlock * kKc);
    float* scratch = cpu::thread_scratch<float>((nc / kBlock * kRange / kBlock + 1) * kBlock * kLd);
    float* turned = scratch + nc / kBlock * kRange / kBlock * kBlock * kLd;  // the last block
    configure_tiles();
    for (int64_t task = begin; task < end; ++task) {
      const int64_t p_begin = task / chunks * kRange, p_end = std::min(P.rows, p_begin + kRange);
      const int64_t q_begin = task % chunks * nc, q_end = std::min(Q.rows, q_begin + nc);
      for (int64_t k0 = 0; k0 < K; k0 += kKc) {
        const int64_t kc = std::min(kKc, K - k0), ld = round_up(kc, kStep);
        const bool last = k0 + kc == K;
        for (int64_t q0 = q_begin; q0 < q_end; q0 += kBlock) {
          copy_q_slice(Q, q0, k0, kc, q_slice, ld);
          for (int64_t p0 = p_begin; p0 < p_end; p0 += kBlock) {
            float* sums = scratch + ((q0 - q_begin) / kBlock * (kRange / kBlock) + (p0 - p_begin) / kBlock) *
                                              kBlock * kLd;
            const uint16_t* panel0 = packed.get() + k0 * panels * kPanel + (p0 / kPanel) * kPanel * ld;
            block_product(q_slice, ld, panel0, panel0 + kPanel * ld, ld, sums, k0 > 0);
            if (!last) continue;
            if (p_rows) turn_block(sums, turned);
            sink(q0, p0, p_rows ? turned : sums, kLd, std::min(kBlock, q_end - q0), std::min(kBlock, p_end - p0));
          }
        }
      }
    }
    release_tiles();
  });
}

}  // namespace opforge::linear_act::amx

#else

#include "opforge/error.h"

namespace opforge::linear_act::amx {
void gemm(const Bf16Operand&, const Bf16Operand&, int64_t, bool, const BlockSink&) {
  fail(ErrorKind::runtime, "linear_act(): the AMX product needs an x86-64 Linux build");
}
}  // namespace opforge::linear_act::amx

#endif
