// layer_norm on the CPU: rows in parallel; per row three SIMD passes, of which only the
// first reads x from memory (a row is in cache after it):
//   1. sum(x - x[0]): shifted by one of the row's own values, the terms are as small as the
//      spread, however large the mean (1e4 + N(0, 1) loses nothing in float32);
//   2. sum(d^2) and sum(d) with d = x - mean: the second refines the mean, and the variance
//      is ss/n - (sum(d)/n)^2, the exact identity for the refined mean;
//   3. (x - mean) * rstd * weight + bias, stored.
// Pass 2 prefetches the next row, so its read from memory overlaps this row's arithmetic.
// The mean is kept as base + mu, base the float nearest it and mu the exact remainder, and
// x - mean is taken as (x - base) - mu. Rounded to one float32 number, a mean of 1e4 would be
// off by up to 5e-4, times rstd, in every output.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/layer_norm/layer_norm_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "opforge/cpu/rows-inl.h"
#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"
#include "opforge/cpu/visit.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::layer_norm_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;

constexpr int64_t kBlock = 16;  // vectors

// The row's mean is base + mu.
template <typename C>
struct Moments {
  C base, mu, rstd;
};

// x is a contiguous row of n >= 1 elements; next (or nullptr) is the row to fetch into cache
// during the second pass, which reads x from cache.
template <typename T>
Moments<Compute<T>> RowMoments(const T* HWY_RESTRICT x, int64_t n, double eps, const T* next = nullptr) {
  using C = Compute<T>;
  const hn::ScalableTag<C> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const C shift = ToCompute(x[0]);
  const auto vshift = hn::Set(d, shift);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    a0 = hn::Add(a0, hn::Sub(LoadAs(d, x + i), vshift));
    a1 = hn::Add(a1, hn::Sub(LoadAs(d, x + i + lanes), vshift));
    a2 = hn::Add(a2, hn::Sub(LoadAs(d, x + i + 2 * lanes), vshift));
    a3 = hn::Add(a3, hn::Sub(LoadAs(d, x + i + 3 * lanes), vshift));
  }
  for (; i + lanes <= n; i += lanes) a0 = hn::Add(a0, hn::Sub(LoadAs(d, x + i), vshift));
  C sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; i < n; ++i) sum += ToCompute(x[i]) - shift;
  const C inv_n = C(1) / static_cast<C>(n);
  const C approx = sum * inv_n;
  const C base = shift + approx;  // TwoSum: base + mu == shift + approx exactly
  const C back = base - shift;
  C mu = (shift - (base - back)) + (approx - back);

  const auto vbase = hn::Set(d, base), vmu = hn::Set(d, mu);
  // Blocks of kBlock vectors are summed apart, then added to the totals, so no partial sum
  // runs over more than kBlock + n / (kBlock * lanes) terms: the variance keeps ~1 ulp.
  auto ss_total = hn::Zero(d), c_total = hn::Zero(d);
  for (i = 0; i + lanes <= n;) {
    const int64_t stop = std::min(n, i + kBlock * lanes);
    if (next) PrefetchBytes(next + i, (stop - i) * static_cast<int64_t>(sizeof(T)));
    auto ss0 = hn::Zero(d), ss1 = hn::Zero(d), c0 = hn::Zero(d), c1 = hn::Zero(d);
    for (; i + 2 * lanes <= stop; i += 2 * lanes) {
      const auto d0 = hn::Sub(hn::Sub(LoadAs(d, x + i), vbase), vmu);
      const auto d1 = hn::Sub(hn::Sub(LoadAs(d, x + i + lanes), vbase), vmu);
      ss0 = hn::MulAdd(d0, d0, ss0);
      ss1 = hn::MulAdd(d1, d1, ss1);
      c0 = hn::Add(c0, d0);
      c1 = hn::Add(c1, d1);
    }
    for (; i + lanes <= stop; i += lanes) {
      const auto d0 = hn::Sub(hn::Sub(LoadAs(d, x + i), vbase), vmu);
      ss0 = hn::MulAdd(d0, d0, ss0);
      c0 = hn::Add(c0, d0);
    }
    ss_total = hn::Add(ss_total, hn::Add(ss0, ss1));
    c_total = hn::Add(c_total, hn::Add(c0, c1));
  }
  C ss = hn::GetLane(hn::SumOfLanes(d, ss_total));
  C c = hn::GetLane(hn::SumOfLanes(d, c_total));
  for (; i < n; ++i) {
    const C di = (ToCompute(x[i]) - base) - mu;
    ss += di * di;
    c += di;
  }
  const C correction = c * inv_n;
  mu += correction;
  const C var = std::max(ss * inv_n - correction * correction, C(0));
  return {base, mu, C(1) / std::sqrt(var + static_cast<C>(eps))};
}

// x, w, b (nullptr: no bias) and out are contiguous rows of n elements.
template <typename T>
void Row(T* HWY_RESTRICT out, const T* HWY_RESTRICT x, const T* HWY_RESTRICT w, const T* HWY_RESTRICT b, int64_t n,
         double eps, bool stream, const T* next) {
  using C = Compute<T>;
  const hn::ScalableTag<C> d;
  const Moments<C> m = RowMoments(x, n, eps, next);
  const auto vbase = hn::Set(d, m.base), vmu = hn::Set(d, m.mu), vrstd = hn::Set(d, m.rstd);
  const auto xhat = [&](int64_t i) { return hn::Mul(hn::Sub(hn::Sub(LoadAs(d, x + i), vbase), vmu), vrstd); };
  const auto xhat1 = [&](int64_t i) { return ((ToCompute(x[i]) - m.base) - m.mu) * m.rstd; };
  if (b)
    WriteRow(out, n, stream, [&](int64_t i) { return hn::MulAdd(xhat(i), LoadAs(d, w + i), LoadAs(d, b + i)); },
             [&](int64_t i) { return ScalarMulAdd(xhat1(i), ToCompute(w[i]), ToCompute(b[i])); });
  else
    WriteRow(out, n, stream, [&](int64_t i) { return hn::Mul(xhat(i), LoadAs(d, w + i)); },
             [&](int64_t i) { return xhat1(i) * ToCompute(w[i]); });
}

void Run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  const TensorView* bias = call.optional_tensor("bias");
  const double eps = call.attr_float("eps");
  cpu::visit_float(x.dtype, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    const int64_t n = x.size(-1);
    if (n == 0) return;
    const int64_t rows = x.numel() / n;
    std::vector<T> w_copy, b_copy;
    const T* w = RowOf(call.tensor("weight"), 0, n, w_copy);
    const T* b = bias ? RowOf(*bias, 0, n, b_copy) : nullptr;
    T* dst = call.output().data_as<T>();
    const bool stream = StreamsOutput<T>(rows * n);
    const int64_t panel = RowSource<T>(x, n).panel_rows();
    parallel_for(rows, std::max(RowsPerChunk(n), panel), [&](int64_t begin, int64_t end) {
      RowSource<T> xs(x, n);
      for (int64_t r = begin; r < end; ++r)
        Row(dst + r * n, xs.row(r, end), w, b, n, eps, stream, NextRowOf<T>(x, r, end, n));
      StreamFence(stream);
    });
  });
}

}  // namespace opforge::layer_norm_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::layer_norm_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(layer_norm, "cpu", float_dtypes(), run);
}  // namespace opforge::layer_norm_cpu
#endif
