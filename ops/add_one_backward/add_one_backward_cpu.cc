// add_one_backward on the CPU: a copy through the shared row walker, so strided and broadcast
// cotangents become contiguous results with the same SIMD row loop as the other ops.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/add_one_backward/add_one_backward_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"
#include "opforge/cpu/transpose-inl.h"
#include "opforge/cpu/visit.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::add_one_backward_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;

struct Identity {
  template <class D>
  HWY_INLINE hn::Vec<D> operator()(D, hn::Vec<D> v) const { return v; }
  template <class C>
  HWY_INLINE C operator()(C v) const { return v; }
};

void Run(const KernelCall& call) {
  const TensorView& grad = call.tensor("grad");
  const TensorView& out = call.output();
  cpu::visit_float(grad.dtype, "add_one_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* src = grad.data_as<const T>();
    T* dst = out.data_as<T>();
    cpu::for_each_row<2>(out.shape, {contiguous_strides(out.shape), grad.strides}, 1 << 15,
                         [&](const cpu::Rows<2>& r) {
                           const auto piece = [&](int64_t c, int64_t j, int64_t n) {
                             UnaryRow(dst + r.at(0, c) + j, src + r.at(1, c) + j * r.inner[1], r.inner[1], n, Identity{});
                           };
                           MapSquaresOrRows<T, 2>(dst, {src}, r, Identity{}, piece);
                         });
  });
}

}  // namespace opforge::add_one_backward_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::add_one_backward_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(add_one_backward, "cpu", float_dtypes(), run);
}  // namespace opforge::add_one_backward_cpu
#endif
