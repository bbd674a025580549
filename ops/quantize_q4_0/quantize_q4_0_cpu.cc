// quantize_q4_0 on the CPU: the shared per-target block quantizer (ggml_quant-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/quantize_q4_0/quantize_q4_0_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include "opforge/cpu/ggml_quant-inl.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::quantize_q4_0_cpu::HWY_NAMESPACE {
using namespace opforge::cpu::HWY_NAMESPACE;

void Run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  switch (x.dtype) {
    case DType::float32: return QuantizeRows<quant::Format::q4_0, float>(x, call.output());
    case DType::float16: return QuantizeRows<quant::Format::q4_0, hwy::float16_t>(x, call.output());
    case DType::bfloat16: return QuantizeRows<quant::Format::q4_0, hwy::bfloat16_t>(x, call.output());
    default: call.fail(ErrorKind::not_implemented, "no cpu kernel for ", dtype_name(x.dtype));
  }
}

}  // namespace opforge::quantize_q4_0_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::quantize_q4_0_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(quantize_q4_0, "cpu", (std::vector<DType>{DType::float32, DType::float16, DType::bfloat16}), run);
}  // namespace opforge::quantize_q4_0_cpu
#endif
