// rms_norm_backward on the CPU. Rows are cut into a number of chunks that depends on the
// shape only; each chunk runs on one thread, row by row: one SIMD pass for sum(x^2) and
// sum(g*w*x), one that writes grad_x (non-temporal stores for a large output) and adds
// g*x*inv into the chunk's own grad_weight partial while prefetching the next row. The
// partials are then added in chunk order, so grad_weight is bitwise the same whatever the
// thread count (single elements round as the vectors' fused operations do, ScalarMulAdd, so an
// element's bits do not depend on which loop took it).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/rms_norm_backward/rms_norm_backward_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "opforge/cpu/rows-inl.h"
#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"
#include "opforge/cpu/visit.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::rms_norm_backward_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;

// One row: g, x, w and gx are contiguous rows of n elements; gw accumulates grad_weight (with
// kWeight: grad_weight is wanted, OpDef::output_mask_slot). next_g, next_x: the next row's (or
// nullptr), prefetched during the second pass, which reads this row from cache, so their reads
// from memory overlap its arithmetic and stores.
// Without kGx (grad_x not asked for, OpDef::output_mask_slot) a row computes sum(x^2) and the
// partial only: no g*w*x sum, no grad_x pass into a scratch row. Each partial element is the
// same fused operation on either path, and nothing else is fused (-ffp-contract=off), so
// grad_weight's bits do not depend on the mask (tests/python/test_output_mask_bits.py).
template <typename T, bool kWeight, bool kGx = true>
void Row(T* HWY_RESTRICT gx, Compute<T>* HWY_RESTRICT gw, const T* HWY_RESTRICT g, const T* HWY_RESTRICT x,
         const T* HWY_RESTRICT w, int64_t n, double eps, bool stream, const T* next_g, const T* next_x) {
  using C = Compute<T>;
  const hn::ScalableTag<C> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  // Two accumulators per sum hide FMA latency without spilling registers.
  auto ss0 = hn::Zero(d), ss1 = hn::Zero(d), dot0 = hn::Zero(d), dot1 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    const auto x0 = LoadAs(d, x + i), x1 = LoadAs(d, x + i + lanes);
    ss0 = hn::MulAdd(x0, x0, ss0);
    ss1 = hn::MulAdd(x1, x1, ss1);
    if constexpr (kGx) {
      dot0 = hn::MulAdd(hn::Mul(LoadAs(d, g + i), LoadAs(d, w + i)), x0, dot0);
      dot1 = hn::MulAdd(hn::Mul(LoadAs(d, g + i + lanes), LoadAs(d, w + i + lanes)), x1, dot1);
    }
  }
  for (; i + lanes <= n; i += lanes) {
    const auto xv = LoadAs(d, x + i);
    ss0 = hn::MulAdd(xv, xv, ss0);
    if constexpr (kGx) dot0 = hn::MulAdd(hn::Mul(LoadAs(d, g + i), LoadAs(d, w + i)), xv, dot0);
  }
  C ss = hn::GetLane(hn::SumOfLanes(d, hn::Add(ss0, ss1)));
  C dot = hn::GetLane(hn::SumOfLanes(d, hn::Add(dot0, dot1)));
  for (; i < n; ++i) {
    const C xi = ToCompute(x[i]);
    ss += xi * xi;
    if constexpr (kGx) dot += ToCompute(g[i]) * ToCompute(w[i]) * xi;
  }
  const C inv = C(1) / std::sqrt(ss / static_cast<C>(n) + static_cast<C>(eps));
  const auto vinv = hn::Set(d, inv);
  PrefetchBytes(next_g, n * static_cast<int64_t>(sizeof(T)));
  PrefetchBytes(next_x, n * static_cast<int64_t>(sizeof(T)));
  if constexpr (!kGx) {  // grad_weight's partial only
    for (i = 0; i + lanes <= n; i += lanes)
      hn::StoreU(hn::MulAdd(hn::Mul(LoadAs(d, g + i), LoadAs(d, x + i)), vinv, hn::LoadU(d, gw + i)), d, gw + i);
    for (; i < n; ++i) gw[i] = ScalarMulAdd(ToCompute(g[i]) * ToCompute(x[i]), inv, gw[i]);
    return;
  }
  const C coef = inv * inv * (dot / static_cast<C>(n));  // grad_x = inv * (g*w - x*coef)
  const auto vcoef = hn::Set(d, coef);
  // Writes grad_x and, element by element in the same sweep, adds into grad_weight's partial.
  WriteRow(gx, n, stream,
           [&](int64_t k) {
             const auto gv = LoadAs(d, g + k), xv = LoadAs(d, x + k);
             if constexpr (kWeight) hn::StoreU(hn::MulAdd(hn::Mul(gv, xv), vinv, hn::LoadU(d, gw + k)), d, gw + k);
             return hn::Mul(vinv, hn::NegMulAdd(xv, vcoef, hn::Mul(gv, LoadAs(d, w + k))));
           },
           [&](int64_t k) {
             const C gk = ToCompute(g[k]), xk = ToCompute(x[k]);
             if constexpr (kWeight) gw[k] = ScalarMulAdd(gk * xk, inv, gw[k]);
             return inv * ScalarMulAdd(-xk, coef, gk * ToCompute(w[k]));
           });
}

// Results not asked for (output_mask) are empty: without grad_x a row computes only its sum of
// squares and partial (Row's kGx), and without grad_weight no partials are kept.
template <typename T, bool kWeight>
void Backward(const KernelCall& call) {
  using C = Compute<T>;
  const TensorView& grad = call.tensor("grad");
  const TensorView& x = call.tensor("x");
  const TensorView& weight = call.tensor("weight");
  const TensorView& gx_out = call.output(0);
  const TensorView& gw_out = call.output(1);
  const double eps = call.attr_float("eps");
  const int64_t n = x.size(-1);
  if (n == 0) return;
  const int64_t rows = x.numel() / n;
  if (rows == 0) {  // no rows: grad_weight is an empty sum
    std::memset(gw_out.data, 0, static_cast<size_t>(gw_out.nbytes()));
    return;
  }
  const bool want_gx = gx_out.numel() > 0;
  T* gx = gx_out.data_as<T>();
  std::vector<T> weight_copy;
  const T* w = RowOf(weight, 0, n, weight_copy);
  const int64_t chunks = RowChunks(rows, n);
  std::vector<C> partial(kWeight ? chunks * n : 0, C(0));
  const bool stream = want_gx && StreamsOutput<T>(rows * n);
  parallel_for(chunks, 1, [&](int64_t begin, int64_t end) {
    RowSource<T> gs(grad, n), xs(x, n);
    for (int64_t k = begin; k < end; ++k) {
      const int64_t last = rows * (k + 1) / chunks;
      C* gw = partial.data() + (kWeight ? k * n : 0);
      for (int64_t r = rows * k / chunks; r < last; ++r) {
        const T *gr = gs.row(r, last), *xr = xs.row(r, last);
        const T *next_g = NextRowOf<T>(grad, r, last, n), *next_x = NextRowOf<T>(x, r, last, n);
        if (want_gx) Row<T, kWeight>(gx + r * n, gw, gr, xr, w, n, eps, stream, next_g, next_x);
        else if constexpr (kWeight) Row<T, true, false>(nullptr, gw, gr, xr, w, n, eps, false, next_g, next_x);
      }
    }
    StreamFence(stream);
  });
  if constexpr (kWeight) SumChunks(gw_out.data_as<T>(), partial.data(), chunks, n);
}

void Run(const KernelCall& call) {
  const bool weight = call.output(1).numel() > 0;
  cpu::visit_float(call.tensor("grad").dtype, "rms_norm_backward", [&](auto tag) {
    weight ? Backward<decltype(tag), true>(call) : Backward<decltype(tag), false>(call);
  });
}

}  // namespace opforge::rms_norm_backward_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::rms_norm_backward_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(rms_norm_backward, "cpu", float_dtypes(), run);
}  // namespace opforge::rms_norm_backward_cpu
#endif
