// mul_backward on the CPU. Same shapes (the common case): one pass reads grad, x and y once
// and writes both gradients. Broadcast operands: each gradient is the product grad * other
// summed down to the operand's shape by the shared sum-to-shape kernel, which multiplies as it
// sums (no temporary) and does not depend on the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/mul_backward/mul_backward_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"
#include "opforge/cpu/sum_to_shape-inl.h"
#include "opforge/cpu/transpose-inl.h"
#include "opforge/cpu/visit.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::mul_backward_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;

// gx[i] = g[i] * y[i] and gy[i] = g[i] * x[i] along row c of a block of the walk.
template <typename T>
HWY_INLINE void BothRow(const cpu::Rows<5>& r, int64_t c, T* gx, T* gy, const T* g, const T* x, const T* y) {
  gx += r.at(0, c), gy += r.at(1, c), g += r.at(2, c), x += r.at(3, c), y += r.at(4, c);
  const int64_t sg = r.inner[2], sx = r.inner[3], sy = r.inner[4];
  const hn::ScalableTag<Compute<T>> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  if (sg == 1 && sx == 1 && sy == 1) {
    for (; i + lanes <= r.len; i += lanes) {
      const auto vg = LoadAs(d, g + i);
      StoreAs(d, hn::Mul(vg, LoadAs(d, y + i)), gx + i);
      StoreAs(d, hn::Mul(vg, LoadAs(d, x + i)), gy + i);
    }
  }
  for (; i < r.len; ++i) {
    const Compute<T> vg = ToCompute(g[i * sg]);
    gx[i] = FromCompute<T>(vg * ToCompute(y[i * sy]));
    gy[i] = FromCompute<T>(vg * ToCompute(x[i * sx]));
  }
}

// out = g * other over a block of the walk's operands out, g and other (indices into r): in
// squares where an input is transposed (transpose-inl.h), else false with nothing done.
template <typename T>
HWY_INLINE bool ProductSquares(const cpu::Rows<5>& r, const std::array<size_t, 3>& operands, T* out, const T* g,
                               const T* other) {
  const cpu::Rows<3> b = cpu::pick_operands<3>(r, operands);
  const auto piece = [&](int64_t c, int64_t j, int64_t n) {
    BinaryRow(out + b.at(0, c) + j, g + b.at(1, c) + j * b.inner[1], b.inner[1], other + b.at(2, c) + j * b.inner[2],
              b.inner[2], n, SumTimes{});
  };
  return MapSquares<T, 3>(out, {g, other}, b, SumTimes{}, piece);
}

void Run(const KernelCall& call) {
  const TensorView& grad = call.tensor("grad");
  const TensorView& x = call.tensor("x");
  const TensorView& y = call.tensor("y");
  cpu::visit_float(grad.dtype, "mul_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* g = grad.data_as<const T>();
    const T* xp = x.data_as<const T>();
    const T* yp = y.data_as<const T>();
    const TensorView &gx_out = call.output(0), &gy_out = call.output(1);
    // Both wanted (output_mask) and no broadcast: one pass for the two. Otherwise each wanted
    // gradient on its own (an empty one, not asked for, is skipped).
    if (x.shape == grad.shape && y.shape == grad.shape && gx_out.numel() > 0 && gy_out.numel() > 0) {
      T* gx = gx_out.data_as<T>();
      T* gy = gy_out.data_as<T>();
      const auto dense = contiguous_strides(grad.shape);
      // A tile with a transposed input: each gradient in squares, g's tile read again from cache
      // (where only grad_x's operands take squares, grad_x is computed again by BothRow: x with
      // a stride no square reads, rare enough not to need its own path).
      cpu::for_each_row<5>(grad.shape, {dense, dense, grad.strides, x.strides, y.strides}, 1 << 15,
                           [&](const cpu::Rows<5>& r) {
                             if (ProductSquares(r, {0, 2, 4}, gx, g, yp) && ProductSquares(r, {1, 2, 3}, gy, g, xp))
                               return;
                             for (int64_t c = 0; c < r.count; ++c) BothRow(r, c, gx, gy, g, xp, yp);
                           });
      return;
    }
    SumToShape<T, 2>(gx_out, grad.shape, {g, yp}, {grad.strides, broadcast_strides(y, grad.shape)});
    SumToShape<T, 2>(gy_out, grad.shape, {g, xp}, {grad.strides, broadcast_strides(x, grad.shape)});
  });
}

}  // namespace opforge::mul_backward_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::mul_backward_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(mul_backward, "cpu", float_dtypes(), run);
}  // namespace opforge::mul_backward_cpu
#endif
