// softmax on the CPU: rows in parallel. A row that fits in L2 (almost every row) takes
// three SIMD passes that touch memory once each way: the max (reads x), exp(x - max) into a
// float scratch row with its sum (x comes from cache now), and the scaled store. A longer
// row would fall out of cache between passes, so it takes an online max-and-sum pass (a
// block at a time) and one write pass instead: x is read twice, nothing else goes to memory.
// Big outputs are written with non-temporal stores; float exps use a short polynomial
// (ExpNonPositiveRound, exp-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/softmax/softmax_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "opforge/cpu/exp-inl.h"
#include "opforge/cpu/rows-inl.h"
#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"
#include "opforge/cpu/visit.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::softmax_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;

// Rows whose float scratch is at most this big take the cached three-pass path.
constexpr int64_t kCachedRowBytes = 256 << 10;
constexpr int64_t kBlock = 16;  // vectors summed apart before joining a row's total

// All-ones lanes where v is NaN or +inf: either makes the whole row NaN, as in torch.
template <class D>
HWY_INLINE hn::Vec<D> Bad(D d, hn::Vec<D> v) {
  return hn::VecFromMask(d, hn::Not(hn::Lt(v, hn::Inf(d))));
}

template <typename T>
void FillNaN(T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = FromCompute<T>(std::numeric_limits<Compute<T>>::quiet_NaN());
}

// out = exp(x - max) * inv; the exps are recomputed from x.
template <typename T>
void WriteFromX(T* HWY_RESTRICT out, const T* HWY_RESTRICT x, int64_t n, Compute<T> max, Compute<T> inv,
                bool stream) {
  const hn::ScalableTag<Compute<T>> d;
  const auto vmax = hn::Set(d, max), vinv = hn::Set(d, inv);
  WriteRow(out, n, stream, [&](int64_t i) { return hn::Mul(ExpNonPositiveRound(d, hn::Sub(LoadAs(d, x + i), vmax)), vinv); },
           [&](int64_t i) { return std::exp(ToCompute(x[i]) - max) * inv; });
}

// The cached path. scratch holds n floats (doubles for float64); next (or nullptr) is the row
// to fetch into cache during the exp pass.
template <typename T>
void CachedRow(T* HWY_RESTRICT out, const T* HWY_RESTRICT x, int64_t n, Compute<T>* HWY_RESTRICT scratch,
               bool stream, const T* next) {
  using C = Compute<T>;
  const hn::ScalableTag<C> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const C lowest = std::numeric_limits<C>::lowest();
  auto m0 = hn::Set(d, lowest), m1 = m0, bad = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    const auto v0 = LoadAs(d, x + i), v1 = LoadAs(d, x + i + lanes);
    m0 = hn::Max(m0, v0);
    m1 = hn::Max(m1, v1);
    bad = hn::Or(bad, hn::Or(Bad(d, v0), Bad(d, v1)));
  }
  for (; i + lanes <= n; i += lanes) {
    const auto v = LoadAs(d, x + i);
    m0 = hn::Max(m0, v);
    bad = hn::Or(bad, Bad(d, v));
  }
  C max = hn::GetLane(hn::MaxOfLanes(d, hn::Max(m0, m1)));
  bool any_bad = !hn::AllFalse(d, hn::MaskFromVec(bad));
  for (; i < n; ++i) {
    const C v = ToCompute(x[i]);
    any_bad |= !(v < std::numeric_limits<C>::infinity());
    max = v > max ? v : max;
  }
  if (any_bad) return FillNaN(out, n);
  const auto vmax = hn::Set(d, max);
  // Blocks of kBlock vectors are summed apart, then added to the total, so no partial sum runs
  // over more than kBlock + n / (kBlock * lanes) terms.
  auto total = hn::Zero(d);
  for (i = 0; i + lanes <= n;) {
    const int64_t stop = std::min(n, i + kBlock * lanes);
    if (next) PrefetchBytes(next + i, (stop - i) * static_cast<int64_t>(sizeof(T)));
    auto s0 = hn::Zero(d), s1 = hn::Zero(d);
    for (; i + 2 * lanes <= stop; i += 2 * lanes) {
      const auto e0 = ExpNonPositiveRound(d, hn::Sub(LoadAs(d, x + i), vmax));
      const auto e1 = ExpNonPositiveRound(d, hn::Sub(LoadAs(d, x + i + lanes), vmax));
      hn::StoreU(e0, d, scratch + i);
      hn::StoreU(e1, d, scratch + i + lanes);
      s0 = hn::Add(s0, e0);
      s1 = hn::Add(s1, e1);
    }
    for (; i + lanes <= stop; i += lanes) {
      const auto e = ExpNonPositiveRound(d, hn::Sub(LoadAs(d, x + i), vmax));
      hn::StoreU(e, d, scratch + i);
      s0 = hn::Add(s0, e);
    }
    total = hn::Add(total, hn::Add(s0, s1));
  }
  C sum = hn::GetLane(hn::SumOfLanes(d, total));
  for (; i < n; ++i) sum += scratch[i] = std::exp(ToCompute(x[i]) - max);
  if (!(sum > 0)) return FillNaN(out, n);  // every entry -inf
  const C inv = C(1) / sum;
  const auto vinv = hn::Set(d, inv);
  WriteRow(out, n, stream, [&](int64_t k) { return hn::Mul(hn::LoadU(d, scratch + k), vinv); },
           [&](int64_t k) { return scratch[k] * inv; });
}

// The online path, a block of kBlock vectors at a time (the block is in L1 for its second
// read): per lane the block's max bm and sum bs of exp(x - bm), merged into a running max m
// and sum s of exp(x - m). One exp per element, two per block for the rescaling.
template <typename T>
void OnlineRow(T* HWY_RESTRICT out, const T* HWY_RESTRICT x, int64_t n, bool stream) {
  using C = Compute<T>;
  const hn::ScalableTag<C> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const C lowest = std::numeric_limits<C>::lowest();
  auto m = hn::Set(d, lowest), s = hn::Zero(d), bad = hn::Zero(d);
  int64_t i = 0;
  while (i + lanes <= n) {
    const int64_t stop = std::min(n, i + kBlock * lanes);
    auto bm = hn::Set(d, lowest);
    int64_t j = i;
    for (; j + lanes <= stop; j += lanes) {
      const auto v = LoadAs(d, x + j);
      bad = hn::Or(bad, Bad(d, v));
      bm = hn::Max(bm, v);
    }
    auto bs = hn::Zero(d);
    for (j = i; j + lanes <= stop; j += lanes) bs = hn::Add(bs, ExpNonPositiveRound(d, hn::Sub(LoadAs(d, x + j), bm)));
    const auto grown = hn::Max(m, bm);
    s = hn::MulAdd(s, ExpNonPositiveRound(d, hn::Sub(m, grown)), hn::Mul(bs, ExpNonPositiveRound(d, hn::Sub(bm, grown))));
    m = grown;
    i = j;
  }
  if (!hn::AllFalse(d, hn::MaskFromVec(bad))) return FillNaN(out, n);
  C lane_m[HWY_MAX_BYTES / sizeof(C)], lane_s[HWY_MAX_BYTES / sizeof(C)];
  hn::StoreU(m, d, lane_m);
  hn::StoreU(s, d, lane_s);
  C max = hn::GetLane(hn::MaxOfLanes(d, m));
  for (int64_t k = i; k < n; ++k) {
    const C v = ToCompute(x[k]);
    if (!(v < std::numeric_limits<C>::infinity())) return FillNaN(out, n);
    max = v > max ? v : max;
  }
  C sum = 0;
  for (int64_t l = 0; l < lanes; ++l) sum += lane_s[l] * std::exp(lane_m[l] - max);
  for (int64_t k = i; k < n; ++k) sum += std::exp(ToCompute(x[k]) - max);
  if (!(sum > 0)) return FillNaN(out, n);  // every entry -inf
  WriteFromX(out, x, n, max, C(1) / sum, stream);
}

void Run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  cpu::visit_float(x.dtype, "softmax", [&](auto tag) {
    using T = decltype(tag);
    using C = Compute<T>;
    const int64_t n = x.size(-1);
    if (n == 0) return;
    const int64_t rows = x.numel() / n;
    const bool cached = n * static_cast<int64_t>(sizeof(C)) <= kCachedRowBytes;
    const bool stream = StreamsOutput<T>(rows * n);
    T* dst = call.output().data_as<T>();
    const int64_t panel = RowSource<T>(x, n).panel_rows();
    parallel_for(rows, std::max(RowsPerChunk(n), panel), [&](int64_t begin, int64_t end) {
      RowSource<T> xs(x, n);
      std::vector<C> scratch(cached ? n : 0);
      for (int64_t r = begin; r < end; ++r) {
        const T* row = xs.row(r, end);
        if (cached) CachedRow(dst + r * n, row, n, scratch.data(), stream, NextRowOf<T>(x, r, end, n));
        else OnlineRow(dst + r * n, row, n, stream);
      }
      StreamFence(stream);
    });
  });
}

}  // namespace opforge::softmax_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::softmax_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(softmax, "cpu", float_dtypes(), run);
}  // namespace opforge::softmax_cpu
#endif
