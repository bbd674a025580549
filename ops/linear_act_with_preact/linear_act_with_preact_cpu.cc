// linear_act_with_preact on the CPU: linear_act's forward (ops/linear_act/forward-inl.h), also
// storing the pre-activation from the product's epilogue.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear_act_with_preact/linear_act_with_preact_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include "opforge/registry.h"
#include "ops/linear_act/forward-inl.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::linear_act_with_preact_cpu::HWY_NAMESPACE {

void Run(const KernelCall& call) { gemm::HWY_NAMESPACE::LinearActForward(call, "linear_act_with_preact", true); }

}  // namespace opforge::linear_act_with_preact_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::linear_act_with_preact_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(linear_act_with_preact, "cpu", float_dtypes(), run);
}  // namespace opforge::linear_act_with_preact_cpu
#endif
