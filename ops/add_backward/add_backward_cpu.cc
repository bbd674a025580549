// add_backward on the CPU: each operand's gradient is grad summed over the dimensions the
// operand was broadcast along, by the shared sum-to-shape kernel (cpu/sum_to_shape-inl.h):
// SIMD along rows, fixed chunking by shape, so results do not depend on the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/add_backward/add_backward_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include "opforge/cpu/sum_to_shape-inl.h"
#include "opforge/cpu/visit.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::add_backward_cpu::HWY_NAMESPACE {
using namespace opforge::cpu::HWY_NAMESPACE;

void Run(const KernelCall& call) {
  const TensorView& grad = call.tensor("grad");
  cpu::visit_float(grad.dtype, "add_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* g = grad.data_as<const T>();
    SumToShape<T, 1>(call.output(0), grad.shape, {g}, {grad.strides});
    SumToShape<T, 1>(call.output(1), grad.shape, {g}, {grad.strides});
  });
}

}  // namespace opforge::add_backward_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::add_backward_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(add_backward, "cpu", float_dtypes(), run);
}  // namespace opforge::add_backward_cpu
#endif
