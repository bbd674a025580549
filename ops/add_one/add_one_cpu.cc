// add_one on the CPU: one SIMD loop per Highway target, strided inputs walked by rows,
// transposed ones in squares.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/add_one/add_one_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"
#include "opforge/cpu/transpose-inl.h"
#include "opforge/cpu/visit.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::add_one_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;

struct PlusOne {
  template <class D>
  HWY_INLINE hn::Vec<D> operator()(D d, hn::Vec<D> v) const { return hn::Add(v, hn::Set(d, 1)); }
  template <class C>
  HWY_INLINE C operator()(C v) const { return v + C(1); }
};

void Run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  const TensorView& out = call.output();
  cpu::visit_numeric(x.dtype, "add_one", [&](auto tag) {
    using T = decltype(tag);
    const T* src = x.data_as<const T>();
    T* dst = out.data_as<T>();
    cpu::for_each_row<2>(out.shape, {contiguous_strides(out.shape), x.strides}, 1 << 15,
                         [&](const cpu::Rows<2>& r) {
                           const auto piece = [&](int64_t c, int64_t j, int64_t n) {
                             UnaryRow(dst + r.at(0, c) + j, src + r.at(1, c) + j * r.inner[1], r.inner[1], n, PlusOne{});
                           };
                           MapSquaresOrRows<T, 2>(dst, {src}, r, PlusOne{}, piece);
                         });
  });
}

}  // namespace opforge::add_one_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::add_one_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(add_one, "cpu",
               (std::vector<DType>{DType::float32, DType::float64, DType::float16, DType::bfloat16,
                                   DType::int32, DType::int64}),
               run);
}  // namespace opforge::add_one_cpu
#endif
