// softmax_backward on the CPU: rows in parallel; per row one SIMD pass for sum(grad * y)
// (the row is then in cache) and one that writes y * (grad - sum).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/softmax_backward/softmax_backward_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include <cstdint>
#include <vector>

#include "opforge/cpu/rows-inl.h"
#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"
#include "opforge/cpu/visit.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::softmax_backward_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;

// g, y and out are contiguous rows of n elements.
template <typename T>
void Row(T* HWY_RESTRICT out, const T* HWY_RESTRICT g, const T* HWY_RESTRICT y, int64_t n, bool stream) {
  using C = Compute<T>;
  const hn::ScalableTag<C> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto acc0 = hn::Zero(d), acc1 = hn::Zero(d), acc2 = hn::Zero(d), acc3 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    acc0 = hn::MulAdd(LoadAs(d, g + i), LoadAs(d, y + i), acc0);
    acc1 = hn::MulAdd(LoadAs(d, g + i + lanes), LoadAs(d, y + i + lanes), acc1);
    acc2 = hn::MulAdd(LoadAs(d, g + i + 2 * lanes), LoadAs(d, y + i + 2 * lanes), acc2);
    acc3 = hn::MulAdd(LoadAs(d, g + i + 3 * lanes), LoadAs(d, y + i + 3 * lanes), acc3);
  }
  for (; i + lanes <= n; i += lanes) acc0 = hn::MulAdd(LoadAs(d, g + i), LoadAs(d, y + i), acc0);
  C dot = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(acc0, acc1), hn::Add(acc2, acc3))));
  for (; i < n; ++i) dot += ToCompute(g[i]) * ToCompute(y[i]);
  const auto vdot = hn::Set(d, dot);
  WriteRow(out, n, stream, [&](int64_t k) { return hn::Mul(LoadAs(d, y + k), hn::Sub(LoadAs(d, g + k), vdot)); },
           [&](int64_t k) { return ToCompute(y[k]) * (ToCompute(g[k]) - dot); });
}

void Run(const KernelCall& call) {
  const TensorView& grad = call.tensor("grad");
  const TensorView& result = call.tensor("result");
  const TensorView& out = call.output();
  cpu::visit_float(grad.dtype, "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t n = out.size(-1);
    if (n == 0) return;
    const int64_t rows = out.numel() / n;
    const auto g_strides = broadcast_strides(grad, out.shape), y_strides = broadcast_strides(result, out.shape);
    T* dst = out.data_as<T>();
    const bool stream = StreamsOutput<T>(rows * n);
    const auto source = [&](const TensorView& t, const Dims& strides) {
      return RowSource<T>(t.data_as<const T>(), out.shape, strides, n);
    };
    const int64_t panel = std::max(source(grad, g_strides).panel_rows(), source(result, y_strides).panel_rows());
    parallel_for(rows, std::max(RowsPerChunk(n), panel), [&](int64_t begin, int64_t end) {
      RowSource<T> gs = source(grad, g_strides), ys = source(result, y_strides);
      for (int64_t r = begin; r < end; ++r) Row(dst + r * n, gs.row(r, end), ys.row(r, end), n, stream);
      StreamFence(stream);
    });
  });
}

}  // namespace opforge::softmax_backward_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::softmax_backward_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(softmax_backward, "cpu", float_dtypes(), run);
}  // namespace opforge::softmax_backward_cpu
#endif
