// layer_norm_backward on the CPU. Rows are cut into a number of chunks that depends on the
// shape only; each chunk runs on one thread, row by row, in three SIMD passes (only the first
// two read memory; the row is in cache for the rest):
//   1. sum(x - x[0]), for the mean (kept as base + mu and subtracted from x in two steps,
//      as in the forward kernel, so a large mean costs no precision);
//   2. with d = x - mean and gw = grad * weight: sum(d^2), sum(d) (refines the mean),
//      sum(gw) and sum(gw * d);
//   3. grad_x stored; grad * xhat and grad added into the chunk's grad_weight and grad_bias
//      partials.
// The partials are then added in chunk order, so grad_weight and grad_bias are bitwise the
// same whatever the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/layer_norm_backward/layer_norm_backward_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "opforge/cpu/rows-inl.h"
#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"
#include "opforge/cpu/visit.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::layer_norm_backward_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;

constexpr int64_t kBlock = 16;  // vectors

// One row: g, x, w and gx are contiguous rows of n elements; pw and pb accumulate the
// grad_weight and grad_bias partials. Which are wanted (OpDef::output_mask_slot): kGx, grad_x
// (without it gx is unused and the row needs only its mean and variance); kPartials, either
// column sum.
template <typename T, bool kGx, bool kPartials>
void Row(T* HWY_RESTRICT gx, Compute<T>* HWY_RESTRICT pw, Compute<T>* HWY_RESTRICT pb, const T* HWY_RESTRICT g,
         const T* HWY_RESTRICT x, const T* HWY_RESTRICT w, int64_t n, double eps, bool stream) {
  using C = Compute<T>;
  const hn::ScalableTag<C> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const C shift = ToCompute(x[0]);
  const auto vshift = hn::Set(d, shift);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    a0 = hn::Add(a0, hn::Sub(LoadAs(d, x + i), vshift));
    a1 = hn::Add(a1, hn::Sub(LoadAs(d, x + i + lanes), vshift));
  }
  for (; i + lanes <= n; i += lanes) a0 = hn::Add(a0, hn::Sub(LoadAs(d, x + i), vshift));
  C sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(a0, a1)));
  for (; i < n; ++i) sum += ToCompute(x[i]) - shift;
  const C inv_n = C(1) / static_cast<C>(n);
  const C approx = sum * inv_n;
  const C base = shift + approx;  // TwoSum: base + mu == shift + approx exactly
  const C back = base - shift;
  C mu = (shift - (base - back)) + (approx - back);

  const auto vbase = hn::Set(d, base), vmu = hn::Set(d, mu);
  // Blocks of kBlock vectors are summed apart, then added to the totals, so no partial sum
  // runs over more than kBlock + n / (kBlock * lanes) terms.
  auto ss_v = hn::Zero(d), c_v = hn::Zero(d), gw_v = hn::Zero(d), dot_v = hn::Zero(d);
  for (i = 0; i + lanes <= n;) {
    const int64_t stop = std::min(n, i + kBlock * lanes);
    auto ss_b = hn::Zero(d), c_b = hn::Zero(d), gw_b = hn::Zero(d), dot_b = hn::Zero(d);
    for (; i + lanes <= stop; i += lanes) {
      const auto dv = hn::Sub(hn::Sub(LoadAs(d, x + i), vbase), vmu);
      ss_b = hn::MulAdd(dv, dv, ss_b);
      c_b = hn::Add(c_b, dv);
      if constexpr (kGx) {
        const auto gwv = hn::Mul(LoadAs(d, g + i), LoadAs(d, w + i));
        gw_b = hn::Add(gw_b, gwv);
        dot_b = hn::MulAdd(gwv, dv, dot_b);
      }
    }
    ss_v = hn::Add(ss_v, ss_b);
    c_v = hn::Add(c_v, c_b);
    gw_v = hn::Add(gw_v, gw_b);
    dot_v = hn::Add(dot_v, dot_b);
  }
  C ss = hn::GetLane(hn::SumOfLanes(d, ss_v)), c = hn::GetLane(hn::SumOfLanes(d, c_v));
  C gw_sum = hn::GetLane(hn::SumOfLanes(d, gw_v)), dot = hn::GetLane(hn::SumOfLanes(d, dot_v));
  for (; i < n; ++i) {
    const C di = (ToCompute(x[i]) - base) - mu, gwi = kGx ? ToCompute(g[i]) * ToCompute(w[i]) : C(0);
    ss += di * di;
    c += di;
    gw_sum += gwi;
    dot += gwi * di;
  }
  const C correction = c * inv_n;
  mu += correction;
  dot -= correction * gw_sum;  // sum(gw * (x - refined mean))
  const C var = std::max(ss * inv_n - correction * correction, C(0));
  const C rstd = C(1) / std::sqrt(var + static_cast<C>(eps));
  // grad_x = rstd * (gw - xhat * mean(gw * xhat)) - rstd * mean(gw)
  const C xhat_coef = rstd * dot * inv_n;
  const C offset = -rstd * gw_sum * inv_n;

  const auto vrstd = hn::Set(d, rstd), vcoef = hn::Set(d, xhat_coef), voffset = hn::Set(d, offset);
  const auto vmu2 = hn::Set(d, mu);
  if constexpr (!kGx) {  // only the partials: grad * xhat and grad
    for (i = 0; i + lanes <= n; i += lanes) {
      const auto gv = LoadAs(d, g + i);
      const auto xhat = hn::Mul(hn::Sub(hn::Sub(LoadAs(d, x + i), vbase), vmu2), vrstd);
      hn::StoreU(hn::MulAdd(gv, xhat, hn::LoadU(d, pw + i)), d, pw + i);
      hn::StoreU(hn::Add(gv, hn::LoadU(d, pb + i)), d, pb + i);
    }
    for (; i < n; ++i) {
      const C gk = ToCompute(g[i]);
      pw[i] = ScalarMulAdd(gk, ((ToCompute(x[i]) - base) - mu) * rstd, pw[i]);
      pb[i] += gk;
    }
    return;
  }
  // Writes grad_x and, element by element in the same sweep, adds into the partials.
  WriteRow(gx, n, stream,
           [&](int64_t k) {
             const auto gv = LoadAs(d, g + k);
             const auto xhat = hn::Mul(hn::Sub(hn::Sub(LoadAs(d, x + k), vbase), vmu2), vrstd);
             if constexpr (kPartials) {
               hn::StoreU(hn::MulAdd(gv, xhat, hn::LoadU(d, pw + k)), d, pw + k);
               hn::StoreU(hn::Add(gv, hn::LoadU(d, pb + k)), d, pb + k);
             }
             return hn::MulAdd(vrstd, hn::NegMulAdd(xhat, vcoef, hn::Mul(gv, LoadAs(d, w + k))), voffset);
           },
           [&](int64_t k) {
             const C gk = ToCompute(g[k]);
             const C xhat = ((ToCompute(x[k]) - base) - mu) * rstd;
             if constexpr (kPartials) {
               pw[k] = ScalarMulAdd(gk, xhat, pw[k]);
               pb[k] += gk;
             }
             return ScalarMulAdd(rstd, ScalarMulAdd(-xhat, xhat_coef, gk * ToCompute(w[k])), offset);
           });
}

// Results not asked for (output_mask) are empty: without grad_x a row computes only its mean,
// variance and partials; without grad_weight and grad_bias no partials are kept (then grad_x
// is wanted: run_kernel skips a call whose results are all empty).
template <typename T, bool kPartials>
void Backward(const KernelCall& call) {
  using C = Compute<T>;
  const TensorView& grad = call.tensor("grad");
  const TensorView& x = call.tensor("x");
  const TensorView& gx_out = call.output(0);
  const double eps = call.attr_float("eps");
  const int64_t n = x.size(-1);
  if (n == 0) return;
  const int64_t rows = x.numel() / n;
  if (rows == 0) {  // no rows: grad_weight and grad_bias are empty sums
    for (size_t k : {1, 2}) std::memset(call.output(k).data, 0, static_cast<size_t>(call.output(k).nbytes()));
    return;
  }
  const bool want_gx = gx_out.numel() > 0;
  T* gx = gx_out.data_as<T>();
  std::vector<T> weight_copy;
  const T* w = RowOf(call.tensor("weight"), 0, n, weight_copy);
  const int64_t chunks = RowChunks(rows, n);
  const int64_t partial_size = kPartials ? chunks * n : 0;
  std::vector<C> partial_w(partial_size, C(0)), partial_b(partial_size, C(0));
  const bool stream = want_gx && StreamsOutput<T>(rows * n);
  parallel_for(chunks, 1, [&](int64_t begin, int64_t end) {
    RowSource<T> gs(grad, n), xs(x, n);
    for (int64_t k = begin; k < end; ++k) {
      const int64_t at = kPartials ? k * n : 0, last = rows * (k + 1) / chunks;
      for (int64_t r = rows * k / chunks; r < last; ++r) {
        const T *gr = gs.row(r, last), *xr = xs.row(r, last);
        want_gx ? Row<T, true, kPartials>(gx + r * n, partial_w.data() + at, partial_b.data() + at, gr, xr, w, n, eps,
                                          stream)
                : Row<T, false, true>(nullptr, partial_w.data() + at, partial_b.data() + at, gr, xr, w, n, eps, false);
      }
    }
    StreamFence(stream);
  });
  if constexpr (kPartials) {
    if (call.output(1).numel()) SumChunks(call.output(1).data_as<T>(), partial_w.data(), chunks, n);
    if (call.output(2).numel()) SumChunks(call.output(2).data_as<T>(), partial_b.data(), chunks, n);
  }
}

void Run(const KernelCall& call) {
  const bool partials = call.output(1).numel() > 0 || call.output(2).numel() > 0;
  cpu::visit_float(call.tensor("grad").dtype, "layer_norm_backward", [&](auto tag) {
    partials ? Backward<decltype(tag), true>(call) : Backward<decltype(tag), false>(call);
  });
}

}  // namespace opforge::layer_norm_backward_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::layer_norm_backward_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(layer_norm_backward, "cpu", float_dtypes(), run);
}  // namespace opforge::layer_norm_backward_cpu
#endif
