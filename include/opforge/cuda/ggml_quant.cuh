// ggml's Q8_0 / Q4_0 block quantization on CUDA, a team of lanes per 32-value block (lane j of
// the team holds its j-th 16-byte piece), byte-identical to the CPU kernels (cpu/ggml_quant-inl.h)
// and so to ggml's reference quantizer. The same exactness rules as there:
// - the absolute maximum is a max over the float bits with the sign cleared (magnitude order
//   for non-NaN floats), so it is exact and order-free;
// - every float operation is an explicit round-to-nearest intrinsic (__fmul_rn, __fadd_rn,
//   __fdiv_rn): nvcc contracts a * b + c into an FMA otherwise, and ggml rounds twice;
// - Q4_0's x * id + 8.5f is a float32 product then a float32 sum, then truncation.
// Format names, block sizes and the attribute parser are shared with the CPU (cpu/ggml_quant.h).
#pragma once

#include <cstdint>

#include "opforge/cpu/ggml_quant.h"
#include "opforge/cuda/common.cuh"

namespace opforge::cuda {

inline constexpr unsigned kFullMask = 0xffffffffu;

// quant::block_bytes, usable in device code.
__host__ __device__ constexpr int64_t block_bytes_of(quant::Format f) { return f == quant::Format::q8_0 ? 34 : 18; }

__device__ __forceinline__ uint16_t half_bits(float d) { return __half_as_ushort(__float2half_rn(d)); }
__device__ __forceinline__ float half_value(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

// A block's 32 values spread over a team of lanes, 16 bytes each (one vector load): 4 float32
// values on 8 lanes, 8 half values on 4 lanes; a warp quantizes 4 or 8 blocks per instruction.
// (One warp per block, a lane per value, kept 16 bytes per thread in flight and issued every
// instruction for a single block, by an estimate ~45 warp instructions per 128 bytes: 28-31% of
// the H200's copy bandwidth.)
template <typename T> inline constexpr int kTeamValues = 16 / static_cast<int>(sizeof(T));
template <typename T> inline constexpr int kTeamLanes = static_cast<int>(quant::kBlock) / kTeamValues<T>;

// Max and sum over each team of L lanes (aligned groups), called by all 32 lanes.
template <int L>
__device__ __forceinline__ uint32_t team_max(uint32_t v) {
#pragma unroll
  for (int o = L / 2; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}
template <int L>
__device__ __forceinline__ int32_t team_sum(int32_t v) {
#pragma unroll
  for (int o = L / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float inverse_scale(float d) { return d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f; }

// roundf(x * id) as the CPU kernel builds it: away from zero when |p| >= |t| + 0.5, exact since
// |t| < 2^23 (or p is integral). |p| <= 127 up to two roundings, so the clamp changes no finite
// block; it keeps the conversion defined for garbage (inf/NaN) blocks, whose bytes the
// declaration leaves unspecified (the CPU keeps the low byte there instead).
__device__ __forceinline__ int8_t quant_q8_0(float x, float id) {
  const float p = __fmul_rn(x, id), t = truncf(p);
  const float r = fabsf(p) >= __fadd_rn(fabsf(t), 0.5f) ? __fadd_rn(t, copysignf(1.0f, p)) : t;
  return static_cast<int8_t>(min(127, max(-128, static_cast<int>(r))));
}

// Q4_0's min(15, trunc(x * id + 8.5f)): a float32 product then a float32 sum, then truncation.
__device__ __forceinline__ uint8_t quant_q4_0(float x, float id) {
  const int v = static_cast<int>(__fadd_rn(__fmul_rn(x, id), 8.5f));  // truncates, as (int8_t) does
  return static_cast<uint8_t>(min(15, max(0, v)));
}

// Q8_0 for a team of L lanes holding E values each (all 32 lanes call it): q = roundf(x * id);
// returns the block's unrounded scale d = amax / 127 (the quants divide by it; the block stores
// it as fp16).
template <int L, int E>
__device__ __forceinline__ float quantize_team_q8_0(const float (&x)[E], int8_t (&q)[E]) {
  uint32_t amax = 0;
#pragma unroll
  for (int e = 0; e < E; ++e) amax = max(amax, __float_as_uint(x[e]) & 0x7fffffffu);
  amax = team_max<L>(amax);
  const float d = __fdiv_rn(__uint_as_float(amax), 127.0f), id = inverse_scale(d);
#pragma unroll
  for (int e = 0; e < E; ++e) q[e] = quant_q8_0(x[e], id);
  return d;
}

// Q4_0 likewise: q = min(15, trunc(x * id + 8.5f)); returns d = max / -8, max the first value of
// largest magnitude in block order (+0 for an all-zero block, so d = -0 as in ggml).
template <int L, int E>
__device__ __forceinline__ float quantize_team_q4_0(const float (&x)[E], uint8_t (&q)[E]) {
  static_assert(L < 32, "a team is part of a warp (its ballot bits are shifted out below)");
  uint32_t bits[E], amax = 0;
#pragma unroll
  for (int e = 0; e < E; ++e) amax = max(amax, bits[e] = __float_as_uint(x[e]) & 0x7fffffffu);
  amax = team_max<L>(amax);
  // This lane's first value of that magnitude, then the team's first lane holding one (lanes hold
  // consecutive values, so that is the block's first).
  bool mine = false;
  float at = 0.0f;
#pragma unroll
  for (int e = E - 1; e >= 0; --e) {
    if (bits[e] == amax) {
      mine = true;
      at = x[e];
    }
  }
  const int lane = threadIdx.x % 32, team_first_lane = lane & ~(L - 1);
  const uint32_t holders = (__ballot_sync(kFullMask, mine) >> team_first_lane) & ((1u << L) - 1);  // never 0
  const float first = __shfl_sync(kFullMask, at, __ffs(static_cast<int>(holders)) - 1, L);
  const float d = __fdiv_rn(amax != 0 ? first : 0.0f, -8.0f), id = inverse_scale(d);
#pragma unroll
  for (int e = 0; e < E; ++e) q[e] = quant_q4_0(x[e], id);
  return d;
}

// Where block g of x ([..., k], any strides) starts: its row through the leading dims'
// indexer, then b * 32 elements along the last dimension. Contiguous x skips the divisions;
// `packed` (contiguous and 16-byte aligned) also loads a lane's 16 bytes as one vector.
struct BlockWalk {
  Indexer rows;
  int64_t inner = 1, nb = 1;
  bool contiguous = true, packed = true;

  __device__ __forceinline__ int64_t offset(int64_t g) const {
    if (contiguous) return g * quant::kBlock;
    const int64_t row = g / nb;
    return rows.offset(row) + (g - row * nb) * quant::kBlock * inner;
  }
};

inline BlockWalk block_walk(const char* op, const TensorView& x) {
  BlockWalk w;
  w.rows = make_indexer(op, {x.shape.begin(), x.shape.end() - 1}, {x.strides.begin(), x.strides.end() - 1});
  w.inner = x.stride(-1);
  w.nb = x.size(-1) / quant::kBlock;
  w.contiguous = x.is_contiguous();
  w.packed = w.contiguous && aligned16(x.data);
  return w;
}

// A block's fp16 scale, little-endian, at o as one 16-bit store. o is even: results are fresh
// allocations (every allocator here aligns to 256 bytes) and blocks are 34 or 18 bytes. Keep it
// one store: the pair of byte stores it replaced lost the low byte of every scale on the H200
// (sm_90, CUDA 13.0). The PTX was right (cvt.rn.f16.f32, then st.global.u8 of the half's bits);
// ptxas turned the low byte's store into F2I.U8.F16.TRUNC, a conversion of the half's value to
// an integer (0 for every scale below 1), as the SASS of that kernel (nvdisasm) shows.
__device__ __forceinline__ void store_scale(uint8_t* o, uint16_t bits) { *reinterpret_cast<uint16_t*>(o) = bits; }

// Blocks each team loads before quantizing any: 64 bytes in flight per thread, as map_contiguous
// keeps (HBM needs several MB in flight: Little's law).
inline constexpr int kBlocksInFlight = 4;

// For every block g of x in [0, blocks), a team of kTeamLanes<T> lanes quantizes it to format F
// and calls sink(g, member, valid, q, d): member the lane's place in the team (it holds values
// member * E .. + E - 1), q those values' quants, d the block's unrounded scale. Every lane calls
// the sink (a sink may shuffle); `valid` is false past the last block. `packed`: walk.packed (a
// parameter of its own: read from the walk in the loop, it cost a spill). The calling threads (`thread` of
// `threads`, whole warps: a grid, or one thread block) take blocks in teams, U at a time, the
// warp's teams on consecutive blocks (one 512-byte load).
template <quant::Format F, int U = kBlocksInFlight, typename T, class Sink>
__device__ __forceinline__ void quantize_by_teams(const Sink& sink, const T* x, const BlockWalk& walk, bool packed,
                                                  int64_t blocks, int64_t thread, int64_t threads) {
  constexpr int E = kTeamValues<T>, L = kTeamLanes<T>;
  const int member = static_cast<int>(thread % L);
  const int64_t teams = threads / L, team = thread / L;
  const int64_t warp_team = thread / 32 * (32 / L);  // the warp's first team: its loop is the warp's
  for (int64_t base = 0; warp_team + base < blocks; base += teams * U) {
    Pack<T> v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t g = team + base + u * teams;
      if (g >= blocks) continue;
      if (packed) {
        v[u] = *reinterpret_cast<const Pack<T>*>(x + g * quant::kBlock + member * E);
      } else {
        const T* p = x + walk.offset(g) + member * E * walk.inner;
#pragma unroll
        for (int e = 0; e < E; ++e) v[u].v[e] = p[e * walk.inner];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (warp_team + base + u * teams >= blocks) break;  // warp-uniform: every lane reaches the shuffles
      const int64_t g = team + base + u * teams;
      const bool valid = g < blocks;
      float f[E];
#pragma unroll
      for (int e = 0; e < E; ++e) f[e] = valid ? static_cast<float>(v[u].v[e]) : 0.0f;
      if constexpr (F == quant::Format::q8_0) {
        int8_t q[E];
        const float d = quantize_team_q8_0<L>(f, q);
        sink(g, member, valid, q, d);
      } else {
        uint8_t q[E];
        const float d = quantize_team_q4_0<L>(f, q);
        sink(g, member, valid, q, d);
      }
    }
  }
}

// quantize_by_teams over the whole grid.
template <quant::Format F, typename T, class Sink>
__global__ void __launch_bounds__(256)  // 62-80 registers: 3 or 4 blocks per SM, 48-64 KB in flight
    quantize_blocks(Sink sink, const T* x, BlockWalk walk, bool packed, int64_t blocks) {
  quantize_by_teams<F>(sink, x, walk, packed, blocks, blockIdx.x * int64_t(blockDim.x) + threadIdx.x,
                       int64_t(gridDim.x) * blockDim.x);
}

// Launches quantize_blocks over x's blocks (blocks > 0) on `stream`.
template <quant::Format F, typename T, class Sink>
void launch_quantize_blocks(Sink sink, const T* x, const BlockWalk& walk, int64_t blocks, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t teams = (blocks + kBlocksInFlight - 1) / kBlocksInFlight;
  const unsigned grid = blocks_for(teams * kTeamLanes<T>, kThreads);
  quantize_blocks<F, T, Sink><<<grid, kThreads, 0, stream>>>(sink, x, walk, walk.packed, blocks);
}

// Quants as little-endian words (byte e % 4 of word e / 4 is quant e).
template <typename Q, int E>
__device__ __forceinline__ void pack_words(const Q (&q)[E], uint32_t (&w)[E / 4]) {
#pragma unroll
  for (int i = 0; i < E / 4; ++i)
    w[i] = uint32_t(uint8_t(q[4 * i])) | uint32_t(uint8_t(q[4 * i + 1])) << 8 | uint32_t(uint8_t(q[4 * i + 2])) << 16 |
           uint32_t(uint8_t(q[4 * i + 3])) << 24;
}

// Words at an even address as 16-bit stores: blocks are 34 or 18 bytes, so their quants are only
// 2-byte aligned.
template <int W>
__device__ __forceinline__ void store_words(uint8_t* o, const uint32_t (&w)[W]) {
  uint16_t* h = reinterpret_cast<uint16_t*>(o);
#pragma unroll
  for (int i = 0; i < W; ++i) h[2 * i] = static_cast<uint16_t>(w[i]), h[2 * i + 1] = static_cast<uint16_t>(w[i] >> 16);
}

// The sink writing ggml's block bytes to out ([..., k / 32 * block bytes], a fresh allocation).
template <quant::Format F>
struct GgmlBlocks {
  uint8_t* out;

  template <typename Q, int E>
  __device__ __forceinline__ void operator()(int64_t g, int member, bool valid, const Q (&q)[E], float d) const {
    uint8_t* o = out + g * block_bytes_of(F);
    uint32_t w[E / 4];
    pack_words(q, w);
    if constexpr (F == quant::Format::q8_0) {
      if (valid) store_words(o + 2 + member * E, w);
    } else {  // byte j: element j (low nibble), element j + 16 (high), held by the lane L / 2 further
      constexpr int L = quant::kBlock / E;
#pragma unroll
      for (int i = 0; i < E / 4; ++i) w[i] |= __shfl_down_sync(kFullMask, w[i], L / 2) << 4;
      if (valid && member < L / 2) store_words(o + 2 + member * E, w);
    }
    if (valid && member == 0) store_scale(o, half_bits(d));
  }
};

// The kernel body of quantize_q8_0 and quantize_q4_0 (argument "x", one uint8 result).
template <quant::Format F>
void launch_quantize(const KernelCall& call, const char* op) {
  const TensorView& x = call.tensor("x");
  const int64_t blocks = x.numel() / quant::kBlock;
  if (blocks == 0) return;  // k == 0: the result is empty too
  const BlockWalk walk = block_walk(op, x);
  const GgmlBlocks<F> sink{call.output().data_as<uint8_t>()};
  const cudaStream_t stream = stream_of(call);
  switch (x.dtype) {
    case DType::float32: launch_quantize_blocks<F>(sink, x.data_as<const float>(), walk, blocks, stream); break;
    case DType::float16: launch_quantize_blocks<F>(sink, x.data_as<const __half>(), walk, blocks, stream); break;
    case DType::bfloat16: launch_quantize_blocks<F>(sink, x.data_as<const __nv_bfloat16>(), walk, blocks, stream); break;
    default: fail(ErrorKind::not_implemented, op, "(): cuda kernel has no ", dtype_name(x.dtype), " variant");
  }
  check_launch(op);
}

}  // namespace opforge::cuda
