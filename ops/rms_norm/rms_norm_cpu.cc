// rms_norm on the CPU: rows in parallel; per row one SIMD pass for the sum of squares
// (four accumulators to hide FMA latency) and one for the scaled output, during which the next
// row is prefetched; big outputs go out as non-temporal stores (rows-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/rms_norm/rms_norm_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include <cmath>
#include <vector>

#include "opforge/cpu/rows-inl.h"
#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"
#include "opforge/cpu/visit.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::rms_norm_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;

// x, w and out are contiguous rows of n elements; next (or nullptr) is the row to fetch into
// cache while this one is written.
template <typename T>
void Row(T* HWY_RESTRICT out, const T* HWY_RESTRICT x, const T* HWY_RESTRICT w, int64_t n, double eps, bool stream,
         const T* next) {
  using C = Compute<T>;
  const hn::ScalableTag<C> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto acc0 = hn::Zero(d), acc1 = hn::Zero(d), acc2 = hn::Zero(d), acc3 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    const auto v0 = LoadAs(d, x + i), v1 = LoadAs(d, x + i + lanes);
    const auto v2 = LoadAs(d, x + i + 2 * lanes), v3 = LoadAs(d, x + i + 3 * lanes);
    acc0 = hn::MulAdd(v0, v0, acc0);
    acc1 = hn::MulAdd(v1, v1, acc1);
    acc2 = hn::MulAdd(v2, v2, acc2);
    acc3 = hn::MulAdd(v3, v3, acc3);
  }
  for (; i + lanes <= n; i += lanes) {
    const auto v = LoadAs(d, x + i);
    acc0 = hn::MulAdd(v, v, acc0);
  }
  C sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(acc0, acc1), hn::Add(acc2, acc3))));
  for (; i < n; ++i) sum += ToCompute(x[i]) * ToCompute(x[i]);
  const C inv = C(1) / std::sqrt(sum / static_cast<C>(n) + static_cast<C>(eps));
  const auto vinv = hn::Set(d, inv);
  PrefetchBytes(next, n * static_cast<int64_t>(sizeof(T)));
  WriteRow(out, n, stream, [&](int64_t k) { return hn::Mul(hn::Mul(LoadAs(d, x + k), vinv), LoadAs(d, w + k)); },
           [&](int64_t k) { return ToCompute(x[k]) * inv * ToCompute(w[k]); });
}

void Run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  const TensorView& weight = call.tensor("weight");
  const TensorView& out = call.output();
  const double eps = call.attr_float("eps");
  cpu::visit_float(x.dtype, "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    const int64_t n = x.size(-1);
    const int64_t rows = x.numel() / n;
    std::vector<T> weight_copy;
    const T* w = RowOf(weight, 0, n, weight_copy);
    T* dst = out.data_as<T>();
    const bool stream = StreamsOutput<T>(rows * n);
    const int64_t panel = RowSource<T>(x, n).panel_rows();
    parallel_for(rows, std::max(RowsPerChunk(n, 1 << 14), panel), [&](int64_t begin, int64_t end) {
      RowSource<T> xs(x, n);
      for (int64_t r = begin; r < end; ++r)
        Row(dst + r * n, xs.row(r, end), w, n, eps, stream, NextRowOf<T>(x, r, end, n));
      StreamFence(stream);
    });
  });
}

}  // namespace opforge::rms_norm_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::rms_norm_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(rms_norm, "cpu", float_dtypes(), run);
}  // namespace opforge::rms_norm_cpu
#endif
