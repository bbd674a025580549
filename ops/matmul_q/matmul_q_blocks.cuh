// matmul_q's CUDA building blocks, shared by its three kernels (matmul_q.cuh has the overview):
// x's quantized form, views of the weights' blocks, runs of them staged as 16-byte pieces, and one
// block's exact term.
#pragma once

#include "opforge/cuda/async_copy.cuh"
#include "opforge/cuda/ggml_quant.cuh"

namespace opforge::matmul_q_cuda {

constexpr int kThreads = 256;

// x quantized: per (row, block) g, 8 words of quants, the scale as fp16 value, the quant sum.
struct QuantizedX {
  int32_t* q;
  float* d;
  int32_t* sum;
};

// The quantizer's sink (opforge/cuda/ggml_quant.cuh) for x: a team's quants as words, its block's
// scale rounded to fp16 (the products use the stored scale) and the sum of its quants.
struct QuantizedXSink {
  QuantizedX xq;

  template <int E>
  __device__ __forceinline__ void operator()(int64_t g, int member, bool valid, const int8_t (&q)[E], float d) const {
    int32_t sum = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) sum += q[e];
    sum = cuda::team_sum<quant::kBlock / E>(sum);
    if (!valid) return;
    uint32_t w[E / 4];
    cuda::pack_words(q, w);
#pragma unroll
    for (int i = 0; i < E / 4; ++i) xq.q[g * 8 + member * (E / 4) + i] = static_cast<int32_t>(w[i]);
    if (member == 0) {
      xq.d[g] = cuda::half_value(cuda::half_bits(d));
      xq.sum[g] = sum;
    }
  }
};

// Weight row c's block b starts at w + c * row_stride + b * bytes * inner; byte j is j * inner
// further. `halves`: inner == 1 and every block 2-byte aligned, so quants load as 16-bit words.
// `spans`: inner == 1, the rows 16-byte aligned and a whole number of 16-byte pieces long (a
// multiple of 8 blocks: 272 or 144 bytes), so runs of blocks from a multiple of 8 load as 16-byte
// pieces (WeightRuns).
struct WeightView {
  const uint8_t* data;
  int64_t row_stride, inner;
  bool halves, spans;
};

// Quant bytes j .. j + 3 of a block as one little-endian word.
__device__ __forceinline__ int32_t quant_word(const uint8_t* p, int64_t inner, bool halves) {
  if (halves) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return static_cast<int32_t>(h[0] | (uint32_t(h[1]) << 16));
  }
  return static_cast<int32_t>(p[0] | (uint32_t(p[inner]) << 8) | (uint32_t(p[2 * inner]) << 16) |
                              (uint32_t(p[3 * inner]) << 24));
}

// Quant words in a weight block: 32 int8 values, or 32 nibbles.
template <quant::Format F>
constexpr int kWords = F == quant::Format::q8_0 ? 8 : 4;

// Weight block b of weight row c: its quants as stored (kWords<F> words) into wq, its fp16
// scale returned as a double.
template <quant::Format F>
__device__ __forceinline__ double load_weight_block(const WeightView& w, int64_t c, int64_t b, int32_t* wq) {
  const uint8_t* block = w.data + c * w.row_stride + b * cuda::block_bytes_of(F) * w.inner;
  const uint8_t* qs = block + 2 * w.inner;
#pragma unroll
  for (int i = 0; i < kWords<F>; ++i) wq[i] = quant_word(qs + 4 * i * w.inner, w.inner, w.halves);
  return static_cast<double>(cuda::half_value(static_cast<uint16_t>(block[0] | (block[w.inner] << 8))));
}

// The blocks of a kernel's chunk (or run) of `most` blocks from block b0: fewer at the row's end.
__device__ __forceinline__ int blocks_from(int64_t nb, int64_t b0, int most) {
  return static_cast<int>(nb - b0 < most ? nb - b0 : most);
}

// Runs of kRun consecutive blocks (from a multiple of kRun) of kCols weight rows, copied by a group
// of kGroup threads into shared memory as 16-byte pieces (WeightView::spans), then read a block at
// a time. A thread loading a whole 34-byte (18-byte) block itself, in 16-bit words, made each load
// instruction of a warp touch ~9 (5) cache lines, 18 (11) instructions a block: by that count
// (an estimate, not a measurement) L1, not HBM, set the kernels' pace.
template <quant::Format F, int kRun, int kCols, int kGroup>
struct WeightRuns {
  static constexpr int kBlockBytes = static_cast<int>(cuda::block_bytes_of(F));
  static constexpr int kPieces = kRun * kBlockBytes / 16;  // per row's run
  static constexpr int kAll = kCols * kPieces, kPerThread = (kAll + kGroup - 1) / kGroup;
  static_assert(kRun % 8 == 0, "8 blocks are a whole number of 16-byte pieces in both formats");

  // Piece i of thread t is piece e = t + i * kGroup: row c0 + e / kPieces, piece e % kPieces of its
  // run of kb blocks from block b0 (rows past n and pieces past the run's last block: none).
  __device__ __forceinline__ static bool has(int e, int64_t c0, int64_t n, int kb) {
    return e < kAll && c0 + e / kPieces < n && e % kPieces < (kb * kBlockBytes + 15) / 16;
  }
  // Where piece e is in global memory (16-byte aligned: WeightView::spans, b0 a multiple of kRun).
  __device__ __forceinline__ static const int4* piece(const WeightView& w, int64_t c0, int64_t b0, int e) {
    return reinterpret_cast<const int4*>(w.data + (c0 + e / kPieces) * w.row_stride + b0 * kBlockBytes) +
           e % kPieces;
  }
  __device__ __forceinline__ static void load(int4 (&r)[kPerThread], const WeightView& w, int64_t c0, int64_t n,
                                              int64_t b0, int kb, int t) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = t + i * kGroup;
      if (has(e, c0, n, kb)) r[i] = *piece(w, c0, b0, e);  // the last piece ends within the row: rows end on one
    }
  }
  __device__ __forceinline__ static void store(int4* runs, const int4 (&r)[kPerThread], int64_t c0, int64_t n, int kb,
                                               int t) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
      if (has(t + i * kGroup, c0, n, kb)) runs[t + i * kGroup] = r[i];
  }
  // All of the group's pieces straight to shared memory (cp.async: no registers held for them).
  __device__ __forceinline__ static void copy_async(int4* runs, const WeightView& w, int64_t c0, int64_t n, int64_t b0,
                                                    int kb, int t) {
    for (int e = t; e < kAll; e += kGroup)
      if (has(e, c0, n, kb)) cuda::copy16_async(runs + e, piece(w, c0, b0, e));
  }
  // Block j of row `col`'s staged run: its quants into wq, its scale returned. A block starts at an
  // even byte, so its quant words are the aligned words there shifted by 0 or 16 bits.
  __device__ __forceinline__ static double block(const int4* runs, int col, int j, int32_t* wq) {
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(runs + col * kPieces);
    const int at = j * kBlockBytes, o = at + 2;  // the block, its quants
    const uint32_t* a = reinterpret_cast<const uint32_t*>(bytes) + o / 4;
    const unsigned shift = (o % 4) * 8;
    uint32_t words[kWords<F> + 1];
#pragma unroll
    for (int i = 0; i < kWords<F>; ++i) words[i] = a[i];
    words[kWords<F>] = shift ? a[kWords<F>] : 0u;  // past the block when the shift is 0
#pragma unroll
    for (int i = 0; i < kWords<F>; ++i) wq[i] = static_cast<int32_t>(__funnelshift_r(words[i], words[i + 1], shift));
    return static_cast<double>(cuda::half_value(reinterpret_cast<const uint16_t*>(bytes)[at / 2]));
  }
};

// One exact term: the int32 dot product of a weight block's quants wq with x's quantized block xw
// (8 words; xsum the sum of its quants, for Q4_0's offset), times both scales, in double.
template <quant::Format F>
__device__ __forceinline__ double block_term(const int32_t* wq, const int32_t* xw, int32_t xsum, double dw, double dx) {
  int32_t s = 0;
  if constexpr (F == quant::Format::q8_0) {
#pragma unroll
    for (int i = 0; i < 8; ++i) s = __dp4a(wq[i], xw[i], s);
  } else {  // byte i holds element i (low nibble) and i + 16 (high nibble), stored as value + 8
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s = __dp4a(wq[i] & 0x0f0f0f0f, xw[i], s);
      s = __dp4a((wq[i] >> 4) & 0x0f0f0f0f, xw[4 + i], s);
    }
    s -= 8 * xsum;
  }
  return __dmul_rn(static_cast<double>(s), __dmul_rn(dw, dx));
}

}  // namespace opforge::matmul_q_cuda
