// linear_act on the CPU: the shared forward (forward-inl.h), SIMD on every target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear_act/linear_act_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include "opforge/registry.h"
#include "ops/linear_act/forward-inl.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::linear_act_cpu::HWY_NAMESPACE {

void Run(const KernelCall& call) { gemm::HWY_NAMESPACE::LinearActForward(call, "linear_act", false); }

}  // namespace opforge::linear_act_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::linear_act_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(linear_act, "cpu", float_dtypes(), run);
}  // namespace opforge::linear_act_cpu
#endif
