// relu_backward on the CPU: the shared activation row loop (cpu/activation-inl.h), SIMD on every
// target, strided and broadcast operands walked by rows, large inputs split across threads.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/relu_backward/relu_backward_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include "opforge/cpu/activation-inl.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::relu_backward_cpu::HWY_NAMESPACE {
using namespace opforge::cpu::HWY_NAMESPACE;

// ReluGrad reads its second operand as relu's input; relu's result is positive exactly where
// that input is, so the same functor serves.
void Run(const KernelCall& call) {
  ActivationBackward("relu_backward", call.tensor("grad"), call.tensor("result"), call.output(), ReluGrad{});
}

}  // namespace opforge::relu_backward_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::relu_backward_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(relu_backward, "cpu", float_dtypes(), run);
}  // namespace opforge::relu_backward_cpu
#endif
