// ggml's Q8_0 / Q4_0 block quantization on CUDA, one warp per 32-value block (lane j holds
// element j), byte-identical to the CPU kernels (cpu/ggml_quant-inl.h) and so to ggml's
// reference quantizer. The same exactness rules as there:
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

__device__ __forceinline__ uint32_t warp_max(uint32_t v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_max_sync(kFullMask, v);
#else
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
#endif
}

__device__ __forceinline__ int32_t warp_sum(int32_t v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_add_sync(kFullMask, v);
#else
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
#endif
}

__device__ __forceinline__ uint16_t half_bits(float d) { return __half_as_ushort(__float2half_rn(d)); }
__device__ __forceinline__ float half_value(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

// Q8_0, called by all 32 lanes: q = roundf(x * id) for this lane's x; returns the block's
// unrounded scale d = amax / 127 (the quants divide by it; the block stores it as fp16).
__device__ __forceinline__ float quantize_lane_q8_0(float x, int8_t& q) {
  const uint32_t amax = warp_max(__float_as_uint(x) & 0x7fffffffu);
  const float d = __fdiv_rn(__uint_as_float(amax), 127.0f);
  const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
  // roundf as the CPU kernel builds it: away from zero when |p| >= |t| + 0.5, exact since
  // |t| < 2^23 (or p is integral). |p| <= 127 up to two roundings, so the clamp changes no
  // finite block; it keeps the conversion defined for garbage (inf/NaN) blocks, whose bytes
  // the declaration leaves unspecified (the CPU keeps the low byte there instead).
  const float p = __fmul_rn(x, id), t = truncf(p);
  const float r = fabsf(p) >= __fadd_rn(fabsf(t), 0.5f) ? __fadd_rn(t, copysignf(1.0f, p)) : t;
  const int v = static_cast<int>(r);
  q = static_cast<int8_t>(min(127, max(-128, v)));
  return d;
}

// Q4_0, called by all 32 lanes: q = min(15, trunc(x * id + 8.5f)) for this lane's x; returns
// d = max / -8, max the first value of largest magnitude (+0 for an all-zero block, so d = -0
// as in ggml).
__device__ __forceinline__ float quantize_lane_q4_0(float x, uint8_t& q) {
  const uint32_t bits = __float_as_uint(x) & 0x7fffffffu;
  const uint32_t amax = warp_max(bits);
  const int first = __ffs(__ballot_sync(kFullMask, bits == amax)) - 1;  // some lane always matches
  const float at_first = __shfl_sync(kFullMask, x, first);
  const float mx = amax != 0 ? at_first : 0.0f;
  const float d = __fdiv_rn(mx, -8.0f);
  const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
  const int v = static_cast<int>(__fadd_rn(__fmul_rn(x, id), 8.5f));  // truncates, as (int8_t) does
  q = static_cast<uint8_t>(min(15, max(0, v)));
  return d;
}

// Where block g of x ([..., k], any strides) starts: its row through the leading dims'
// indexer, then b * 32 elements along the last dimension. Contiguous x skips the divisions.
struct BlockWalk {
  Indexer rows;
  int64_t inner = 1, nb = 1;
  bool contiguous = true;

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
  return w;
}

// A block's fp16 scale, little-endian, at o as one 16-bit store. o is even: results are fresh
// allocations (every allocator here aligns to 256 bytes) and blocks are 34 or 18 bytes. Keep it
// one store: the pair of byte stores it replaced lost the low byte of every scale on the H200
// (sm_90, CUDA 13.0). The PTX was right (cvt.rn.f16.f32, then st.global.u8 of the half's bits);
// ptxas turned the low byte's store into F2I.U8.F16.TRUNC, a conversion of the half's value to
// an integer (0 for every scale below 1), as the SASS of that kernel (nvdisasm) shows.
__device__ __forceinline__ void store_scale(uint8_t* o, uint16_t bits) { *reinterpret_cast<uint16_t*>(o) = bits; }

// Blocks each warp loads before quantizing any: one 4-byte load in flight per thread kept HBM at
// about 30% of the H100's copy bandwidth (Little's law, as for map_contiguous).
inline constexpr int kBlocksPerWarp = 4;

// out ([..., k / 32 * block bytes], contiguous) = x quantized per 32-value block, one warp a
// block (kBlocksPerWarp at a time, a warp-stride apart) in a grid-stride loop.
template <quant::Format F, typename T>
__global__ void quantize_kernel(uint8_t* out, const T* x, BlockWalk walk, int64_t blocks) {
  constexpr int U = kBlocksPerWarp;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t first = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; first < blocks; first += warps * U) {
    float v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t g = first + u * warps;  // the same for the whole warp: the shuffles below see all lanes
      if (g < blocks) v[u] = static_cast<float>(load(x + walk.offset(g) + lane * walk.inner));
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t g = first + u * warps;
      if (g >= blocks) break;
      uint8_t* o = out + g * block_bytes_of(F);
      float d;
      if constexpr (F == quant::Format::q8_0) {
        int8_t q;
        d = quantize_lane_q8_0(v[u], q);
        o[2 + lane] = static_cast<uint8_t>(q);
      } else {
        uint8_t q;
        d = quantize_lane_q4_0(v[u], q);
        const uint8_t high = static_cast<uint8_t>(__shfl_down_sync(kFullMask, q, 16));  // element lane + 16
        if (lane < 16) o[2 + lane] = static_cast<uint8_t>(q | (high << 4));
      }
      if (lane == 0) store_scale(o, half_bits(d));
    }
  }
}

// The kernel body of quantize_q8_0 and quantize_q4_0 (argument "x", one uint8 result).
template <quant::Format F>
void launch_quantize(const KernelCall& call, const char* op) {
  const TensorView& x = call.tensor("x");
  const int64_t blocks = x.numel() / quant::kBlock;
  if (blocks == 0) return;  // k == 0: the result is empty too
  const BlockWalk walk = block_walk(op, x);
  const auto launch = [&](auto tag) {
    using T = decltype(tag);
    constexpr int kThreads = 256;
    const int64_t warps_needed = (blocks + kBlocksPerWarp - 1) / kBlocksPerWarp;
    quantize_kernel<F, T><<<blocks_for(warps_needed * 32, kThreads), kThreads, 0, stream_of(call)>>>(
        call.output().data_as<uint8_t>(), x.data_as<const T>(), walk, blocks);
  };
  switch (x.dtype) {
    case DType::float32: launch(float{}); break;
    case DType::float16: launch(__half{}); break;
    case DType::bfloat16: launch(__nv_bfloat16{}); break;
    default: fail(ErrorKind::not_implemented, op, "(): cuda kernel has no ", dtype_name(x.dtype), " variant");
  }
  check_launch(op);
}

}  // namespace opforge::cuda
