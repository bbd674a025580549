// mul on the CPU: broadcast operands get stride 0, so a scalar or a row broadcast stays a
// SIMD loop; other strides take the scalar path of the same row loop.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/mul/mul_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"
#include "opforge/cpu/visit.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::mul_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;

struct Times {
  template <class D, class V>
  HWY_INLINE V operator()(D, V a, V b) const { return hn::Mul(a, b); }
  template <class C>
  HWY_INLINE C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      // Wraps like NumPy and torch; the unsigned product avoids signed-overflow UB.
      using U = std::make_unsigned_t<C>;
      return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  }
};

void Run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  const TensorView& y = call.tensor("y");
  const TensorView& out = call.output();
  cpu::visit_numeric(x.dtype, "mul", [&](auto tag) {
    using T = decltype(tag);
    const T* a = x.data_as<const T>();
    const T* b = y.data_as<const T>();
    T* dst = out.data_as<T>();
    cpu::for_each_row<3>(
        out.shape,
        {contiguous_strides(out.shape), broadcast_strides(x, out.shape), broadcast_strides(y, out.shape)},
        1 << 15, [&](const cpu::Row<3>& r) {
          BinaryRow(dst + r.offsets[0], a + r.offsets[1], r.inner[1], b + r.offsets[2], r.inner[2], r.len, Times{});
        });
  });
}

}  // namespace opforge::mul_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::mul_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(mul, "cpu",
               (std::vector<DType>{DType::float32, DType::float64, DType::float16, DType::bfloat16,
                                   DType::int32, DType::int64}),
               run);
}  // namespace opforge::mul_cpu
#endif
