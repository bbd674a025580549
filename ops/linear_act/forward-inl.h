// linear_act's CPU forward, shared by linear_act and linear_act_with_preact (which also writes
// the pre-activation, its second result): one blocked product (gemm-inl.h) whose epilogue adds
// the bias, applies the activation and rounds to the output dtype tile by tile, while the tile
// is in L1. Re-included once per Highway target.
#if defined(OPFORGE_OPS_LINEAR_ACT_FORWARD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_OPS_LINEAR_ACT_FORWARD_INL_H_
#undef OPFORGE_OPS_LINEAR_ACT_FORWARD_INL_H_
#else
#define OPFORGE_OPS_LINEAR_ACT_FORWARD_INL_H_
#endif

#include <hwy/highway.h>

#include <vector>

#include "opforge/cpu/visit.h"
#include "opforge/kernel.h"
#include "ops/linear_act/epilogue-inl.h"
#include "ops/linear_act/linear_act.h"
#include "ops/linear_act/matmul-inl.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::gemm::HWY_NAMESPACE {

// out = act(x @ weight^T + bias) into call.output(0); with save_preact, the sum before act into
// call.output(1) as well.
inline void LinearActForward(const KernelCall& call, const char* op, bool save_preact) {
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("weight");
  const TensorView& out = call.output(0);
  cpu::visit_float(x.dtype, op, [&](auto tag) {
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
    T* preact = save_preact ? call.output(1).data_as<T>() : nullptr;
    VisitAct(call.attr_str("act"), op, [&](auto act, auto) {
      const BiasAct<T, decltype(act)> epi(out.data_as<T>(), n, bias ? bias_c.data() : nullptr, act, preact);
      Matmul(a, b, k, epi);
    });
  });
}

}  // namespace opforge::gemm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_OPS_LINEAR_ACT_FORWARD_INL_H_
