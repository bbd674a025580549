// silu on the CPU: the shared activation row loop (cpu/activation-inl.h), SIMD on every
// target, strided and broadcast operands walked by rows, large inputs split across threads.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/silu/silu_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include "opforge/cpu/activation-inl.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::silu_cpu::HWY_NAMESPACE {
using namespace opforge::cpu::HWY_NAMESPACE;

void Run(const KernelCall& call) { ActivationForward("silu", call.tensor("x"), call.output(), Silu{}); }

}  // namespace opforge::silu_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::silu_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(silu, "cpu", float_dtypes(), run);
}  // namespace opforge::silu_cpu
#endif
