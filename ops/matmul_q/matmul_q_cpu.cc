// matmul_q on the CPU. Per Highway target: quantize the activations to Q8_0 with the shared
// block quantizer (the bytes quantize_q8_0 writes), then hand the integer products to the
// path this target stands for: AVX3 -> AVX-512 VNNI (the AVX2 target's code where the CPU lacks
// it), AVX2 -> AVX-VNNI's 256-bit vpdpbusd where the CPU has it, pmaddubsw elsewhere, Arm's NEON
// -> SDOT where the CPU has it (matmul_q_arm.cc), anything else -> the portable scalar loop.
// Pinning a SIMD target (OPFORGE_SIMD, opforge.set_simd_target) therefore pins the path, and the
// Python tests run every one this CPU has but pmaddubsw where AVX-VNNI takes its place;
// tests/cpp/test_matmul_q_paths.cc calls every SIMD path (x86's and SDOT) itself.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/matmul_q/matmul_q_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "opforge/cpu/ggml_quant-inl.h"
#include "opforge/registry.h"
#include "ops/matmul_q/matmul_q.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::matmul_q::HWY_NAMESPACE {
using namespace opforge::cpu::HWY_NAMESPACE;

struct QuantizedX {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> sum;
};

// x: [..., k] with any strides -> per row and block: quants, fp16-rounded scale, sum of quants.
template <typename T>
void QuantizeActivations(const TensorView& x, int64_t m, int64_t nb, QuantizedX& out) {
  out.q.resize(m * nb * quant::kBlock);
  out.d.resize(m * nb);
  out.sum.resize(m * nb);
  const int64_t inner = x.stride(-1);
  parallel_for(m * nb, 512, [&](int64_t begin, int64_t end) {
    T gathered[quant::kBlock];
    quant::BlockCursor<T> cursor(x, quant::kBlock, begin);
    for (int64_t g = begin; g < end; ++g, cursor.next()) {
      const T* block = cursor.get();
      if (inner != 1) {
        for (int64_t j = 0; j < quant::kBlock; ++j) gathered[j] = block[j * inner];
        block = gathered;
      }
      int8_t* q = out.q.data() + g * quant::kBlock;
      out.d[g] = to_float(to_float16(QuantizeBlockQ8_0(block, q)));
      int32_t sum = 0;
      for (int64_t j = 0; j < quant::kBlock; ++j) sum += q[j];
      out.sum[g] = sum;
    }
  });
}

template <typename T>
void Typed(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("w");
  const TensorView& out = call.output();
  const quant::Format format = quant::format_of(call);
  const int64_t k = x.size(-1), nb = k / quant::kBlock, n = w.size(0);
  const int64_t m = out.numel() / n;
  QuantizedX xq;
  QuantizeActivations<T>(x, m, nb, xq);
  std::vector<uint8_t> w_copy;  // the kernels read whole contiguous weight rows
  const uint8_t* w_data = w.data_as<const uint8_t>();
  if (!w.is_contiguous()) {
    w_copy.resize(w.numel());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < w.size(1); ++j) w_copy[i * w.size(1) + j] = w_data[i * w.stride(0) + j * w.stride(1)];
    w_data = w_copy.data();
  }
  const Activations a{xq.q.data(), xq.d.data(), xq.sum.data(), m, nb};
  const Weights weights{w_data, n, nb, w.size(1), format};
  std::vector<float> y_float(std::is_same_v<T, float> ? 0 : m * n);
  float* y = std::is_same_v<T, float> ? out.data_as<float>() : y_float.data();
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if (cpu_has_avx512_vnni())
    gemm_vnni(a, weights, y);
  else
    cpu_has_avx_vnni() ? gemm_avx_vnni(a, weights, y) : gemm_avx2(a, weights, y);
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  cpu_has_avx_vnni() ? gemm_avx_vnni(a, weights, y) : gemm_avx2(a, weights, y);
#elif HWY_ARCH_ARM_A64 && defined(__linux__)
  cpu_has_arm_dotprod() ? gemm_arm_dotprod(a, weights, y) : gemm_scalar(a, weights, y);
#else
  gemm_scalar(a, weights, y);
#endif
  if constexpr (!std::is_same_v<T, float>) {
    T* dst = out.data_as<T>();
    parallel_for(m * n, 1 << 15, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) dst[i] = FromCompute<T>(y[i]);
    });
  }
}

void Run(const KernelCall& call) {
  switch (call.tensor("x").dtype) {
    case DType::float32: return Typed<float>(call);
    case DType::float16: return Typed<hwy::float16_t>(call);
    case DType::bfloat16: return Typed<hwy::bfloat16_t>(call);
    default: call.fail(ErrorKind::not_implemented, "no cpu kernel for ", dtype_name(call.tensor("x").dtype));
  }
}

}  // namespace opforge::matmul_q::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::matmul_q {

namespace {
int32_t dot_block(quant::Format format, const uint8_t* qs, const int8_t* x) {
  int32_t s = 0;
  if (format == quant::Format::q8_0) {
    for (int64_t j = 0; j < quant::kBlock; ++j) s += static_cast<int8_t>(qs[j]) * x[j];
  } else {
    for (int64_t j = 0; j < quant::kBlock / 2; ++j)
      s += ((qs[j] & 0x0f) - 8) * x[j] + ((qs[j] >> 4) - 8) * x[j + quant::kBlock / 2];
  }
  return s;
}
}  // namespace

// The reference every SIMD path must match bit for bit: one output at a time, blocks in order.
void gemm_scalar(const Activations& a, const Weights& w, float* y) {
  const int64_t bytes = quant::block_bytes(w.format);
  parallel_for(w.n, std::max<int64_t>(1, 4096 / (a.m * a.nb + 1)), [&](int64_t begin, int64_t end) {
    std::vector<double> dw(a.nb);
    for (int64_t c = begin; c < end; ++c) {
      const uint8_t* row = w.data + c * w.row_bytes;
      for (int64_t b = 0; b < a.nb; ++b) dw[b] = quant::load_scale(row + b * bytes);
      for (int64_t r = 0; r < a.m; ++r) {
        double acc = 0.0;
        for (int64_t b = 0; b < a.nb; ++b) {
          const int64_t g = r * a.nb + b;
          const int32_t s = dot_block(w.format, row + b * bytes + 2, a.q + g * quant::kBlock);
          acc += static_cast<double>(s) * (dw[b] * static_cast<double>(a.d[g]));
        }
        y[r * w.n + c] = static_cast<float>(acc);
      }
    }
  });
}

HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(matmul_q, "cpu", (std::vector<DType>{DType::float32, DType::float16, DType::bfloat16}), run);

}  // namespace opforge::matmul_q
#endif
