// rope_backward on the CPU: the rotation in ops/rope/rope-inl.h, by -theta.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/rope_backward/rope_backward_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include "opforge/registry.h"
#include "ops/rope/rope-inl.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::rope_backward_cpu::HWY_NAMESPACE {
void Run(const KernelCall& call) { rope_cpu::HWY_NAMESPACE::Rotate(call, "rope_backward", call.tensor("grad"), true); }
}  // namespace opforge::rope_backward_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::rope_backward_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(rope_backward, "cpu", float_dtypes(), run);
}  // namespace opforge::rope_backward_cpu
#endif
