// dequantize on CUDA: contiguous q four values a thread (packed_kernel); any other layout one
// thread per output value, reading the scale and the quant byte of its block (32 neighbouring
// threads share them, so the loads coalesce). Each value is q * d (Q8_0) or (nibble - 8) * d
// (Q4_0). The product is exact in float32 (an 8-bit
// integer times an fp16 value), so it equals the CPU kernel's bit for bit.
#include "opforge/cuda/ggml_quant.cuh"
#include "opforge/registry.h"

namespace opforge::dequantize_cuda {

constexpr int kThreads = 256;

// Block g of q ([..., blocks * bytes], any strides), byte j at base + j * inner.
struct Blocks {
  cuda::Indexer rows;
  int64_t inner, nb;
  bool contiguous;
};

template <quant::Format F>
__global__ void kernel(float* out, const uint8_t* q, Blocks blocks, int64_t n) {
  constexpr int64_t bytes = cuda::block_bytes_of(F);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t g = i / quant::kBlock;
    const int j = static_cast<int>(i % quant::kBlock);
    int64_t base;
    if (blocks.contiguous) {
      base = g * bytes;
    } else {
      const int64_t row = g / blocks.nb;
      base = blocks.rows.offset(row) + (g - row * blocks.nb) * bytes * blocks.inner;
    }
    const uint8_t* block = q + base;
    const int64_t s = blocks.inner;
    const float d = cuda::half_value(static_cast<uint16_t>(block[0] | (block[s] << 8)));
    int v;
    if constexpr (F == quant::Format::q8_0) {
      v = static_cast<int8_t>(block[(2 + j) * s]);
    } else {
      const uint8_t byte = block[(2 + (j & 15)) * s];
      v = (j < 16 ? byte & 0x0f : byte >> 4) - 8;
    }
    out[i] = __fmul_rn(static_cast<float>(v), d);
  }
}

// Contiguous q: four outputs a thread, one float4 store; the scale and the four quants as 16-bit
// loads (a block starts at an even byte: 34 or 18 bytes, and a group's quants at an even offset
// in it). The per-value kernel above spent four byte loads and a store per float, which held the
// first version to 32% of the H200's copy bandwidth.
template <quant::Format F>
__global__ void packed_kernel(float4* out, const uint8_t* q, int64_t groups) {
  constexpr int64_t bytes = cuda::block_bytes_of(F);
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < groups; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t g = t / (quant::kBlock / 4);
    const int j = static_cast<int>(t % (quant::kBlock / 4)) * 4;  // the group's first value in the block
    const uint8_t* block = q + g * bytes;
    const float d = cuda::half_value(*reinterpret_cast<const uint16_t*>(block));
    const int at = 2 + (F == quant::Format::q8_0 ? j : (j & 15));
    const uint16_t lo = *reinterpret_cast<const uint16_t*>(block + at);
    const uint16_t hi = *reinterpret_cast<const uint16_t*>(block + at + 2);
    const uint8_t b[4] = {uint8_t(lo), uint8_t(lo >> 8), uint8_t(hi), uint8_t(hi >> 8)};
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int value = F == quant::Format::q8_0 ? static_cast<int8_t>(b[e]) : (j < 16 ? b[e] & 0x0f : b[e] >> 4) - 8;
      v[e] = __fmul_rn(static_cast<float>(value), d);
    }
    out[t] = make_float4(v[0], v[1], v[2], v[3]);
  }
}

template <quant::Format F>
void launch(const TensorView& q, const TensorView& out, const Blocks& blocks, cudaStream_t stream) {
  const int64_t n = out.numel();
  if (blocks.contiguous && cuda::aligned16(out.data) && reinterpret_cast<uintptr_t>(q.data) % 2 == 0) {
    packed_kernel<F><<<cuda::blocks_for(n / 4, kThreads), kThreads, 0, stream>>>(
        static_cast<float4*>(out.data), q.data_as<const uint8_t>(), n / 4);  // n is a multiple of 32
  } else {
    kernel<F><<<cuda::blocks_for(n, kThreads), kThreads, 0, stream>>>(out.data_as<float>(), q.data_as<const uint8_t>(),
                                                                       blocks, n);
  }
}

void run(const KernelCall& call) {
  const char* op = "dequantize";
  const TensorView& q = call.tensor("q");
  const TensorView& out = call.output();
  const quant::Format format = quant::format_of(call);
  Blocks blocks;
  blocks.rows = cuda::make_indexer(op, {q.shape.begin(), q.shape.end() - 1}, {q.strides.begin(), q.strides.end() - 1});
  blocks.inner = q.stride(-1);
  blocks.nb = q.size(-1) / quant::block_bytes(format);
  blocks.contiguous = q.is_contiguous();
  cudaStream_t stream = cuda::stream_of(call);
  if (format == quant::Format::q8_0)
    launch<quant::Format::q8_0>(q, out, blocks, stream);
  else
    launch<quant::Format::q4_0>(q, out, blocks, stream);
  cuda::check_launch(op);
}

OPFORGE_KERNEL(dequantize, "cuda", (std::vector<DType>{DType::uint8}), run);

}  // namespace opforge::dequantize_cuda
