// gelu_backward on the CPU: the shared activation row loop (cpu/activation-inl.h), SIMD on every
// target, strided and broadcast operands walked by rows, large inputs split across threads;
// Phi as in gelu (vectorized erfc in float32, std::erfc lane by lane in float64).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/gelu_backward/gelu_backward_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include "opforge/cpu/activation-inl.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::gelu_backward_cpu::HWY_NAMESPACE {
using namespace opforge::cpu::HWY_NAMESPACE;

void Run(const KernelCall& call) {
  const TensorView& grad = call.tensor("grad");
  const TensorView& x = call.tensor("x");
  if (call.attr_str("approximate") == "tanh") ActivationBackward("gelu_backward", grad, x, call.output(), GeluTanhGrad{});
  else ActivationBackward("gelu_backward", grad, x, call.output(), GeluErfGrad{});
}

}  // namespace opforge::gelu_backward_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::gelu_backward_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(gelu_backward, "cpu", float_dtypes(), run);
}  // namespace opforge::gelu_backward_cpu
#endif
