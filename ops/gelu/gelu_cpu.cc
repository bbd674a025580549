// gelu on the CPU: the shared activation row loop (cpu/activation-inl.h), SIMD on every
// target, strided and broadcast operands walked by rows, large inputs split across threads;
// the exact form's Phi is a vectorized erfc in float32 (cpu/activation-inl.h) and std::erfc lane by lane in float64.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/gelu/gelu_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include "opforge/cpu/activation-inl.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::gelu_cpu::HWY_NAMESPACE {
using namespace opforge::cpu::HWY_NAMESPACE;

void Run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  if (call.attr_str("approximate") == "tanh") ActivationForward("gelu", x, call.output(), GeluTanh{});
  else ActivationForward("gelu", x, call.output(), GeluErf{});
}

}  // namespace opforge::gelu_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::gelu_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(gelu, "cpu", float_dtypes(), run);
}  // namespace opforge::gelu_cpu
#endif
