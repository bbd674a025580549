// linear_act on the CPU: one blocked product (gemm-inl.h) whose epilogue adds the bias, applies
// the activation and rounds to the output dtype tile by tile, while the tile is in L1.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear_act/linear_act_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include <vector>

#include "opforge/cpu/visit.h"
#include "opforge/registry.h"
#include "ops/linear_act/epilogue-inl.h"
#include "ops/linear_act/matmul-inl.h"
#include "ops/linear_act/linear_act.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::linear_act_cpu::HWY_NAMESPACE {
using namespace opforge::gemm::HWY_NAMESPACE;

void Run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("weight");
  const TensorView& out = call.output();
  cpu::visit_float(x.dtype, "linear_act", [&](auto tag) {
    using T = decltype(tag);
    const int64_t k = x.size(-1), n = w.size(0), m = out.numel() / n;
    int64_t xrs;
    std::vector<T> x_copy;
    Operand<T> a{x.data_as<const T>(), m, 0, x.stride(-1)};
    if (linear_act::row_stride(x, &xrs)) {
      a.rs = xrs;
    } else {
      x_copy = linear_act::gather_rows<T>(x);
      a = {x_copy.data(), m, k, 1};
    }
    const Operand<T> b{w.data_as<const T>(), n, w.stride(0), w.stride(1)};
    const TensorView* bias = call.optional_tensor("bias");
    const auto bias_c = PaddedBias<T>(bias, n);
    VisitAct(call.attr_str("act"), "linear_act", [&](auto act, auto) {
      const BiasAct<T, decltype(act)> epi(out.data_as<T>(), n, bias ? bias_c.data() : nullptr, act);
      Matmul(a, b, k, epi);
    });
  });
}

}  // namespace opforge::linear_act_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::linear_act_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(linear_act, "cpu", float_dtypes(), run);
}  // namespace opforge::linear_act_cpu
#endif
