// add on the CPU: broadcast operands get stride 0, so a scalar or a row broadcast stays a
// SIMD loop; other strides take the scalar path of the same row loop.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/add/add_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include "opforge/cpu/binary-inl.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::add_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;

struct Plus {
  template <class D, class V>
  HWY_INLINE V operator()(D, V a, V b) const { return hn::Add(a, b); }
  template <class C>
  HWY_INLINE C operator()(C a, C b) const { return a + b; }
};

void Run(const KernelCall& call) {
  BroadcastBinary("add", call.tensor("x"), call.tensor("y"), call.output(), Plus{});
}

}  // namespace opforge::add_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::add_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(add, "cpu",
               (std::vector<DType>{DType::float32, DType::float64, DType::float16, DType::bfloat16,
                                   DType::int32, DType::int64}),
               run);
}  // namespace opforge::add_cpu
#endif
