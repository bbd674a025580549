// dequantize on CUDA: one thread per output value. Thread i reads the scale and the quant byte
// of its block (32 neighbouring threads share them, so the loads coalesce) and writes one
// float: q * d (Q8_0) or (nibble - 8) * d (Q4_0). The product is exact in float32 (an 8-bit
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
  const int64_t n = out.numel();
  cudaStream_t stream = cuda::stream_of(call);
  if (format == quant::Format::q8_0)
    kernel<quant::Format::q8_0><<<cuda::blocks_for(n, kThreads), kThreads, 0, stream>>>(
        out.data_as<float>(), q.data_as<const uint8_t>(), blocks, n);
  else
    kernel<quant::Format::q4_0><<<cuda::blocks_for(n, kThreads), kThreads, 0, stream>>>(
        out.data_as<float>(), q.data_as<const uint8_t>(), blocks, n);
  cuda::check_launch(op);
}

OPFORGE_KERNEL(dequantize, "cuda", (std::vector<DType>{DType::uint8}), run);

}  // namespace opforge::dequantize_cuda
