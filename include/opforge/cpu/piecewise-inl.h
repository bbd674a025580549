// Evaluating the piecewise polynomials of piecewise_tables.h in SIMD: one interval per lane,
// so each coefficient is one in-register table lookup. Re-included once per Highway target,
// like the kernels using it.
#if defined(OPFORGE_CPU_PIECEWISE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_CPU_PIECEWISE_INL_H_
#undef OPFORGE_CPU_PIECEWISE_INL_H_
#else
#define OPFORGE_CPU_PIECEWISE_INL_H_
#endif

#include <hwy/highway.h>

#include "opforge/cpu/exp-inl.h"
#include "opforge/cpu/piecewise_tables.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Whether float vectors on this target have tables: 16 lanes (AVX-512) and 8 (AVX2). Narrower
// targets have too few lanes for enough intervals; their callers compute from exp instead.
template <class D>
inline constexpr bool kHasPiecewiseTables =
    sizeof(hn::TFromD<D>) == 4 && (hn::MaxLanes(D()) == 16 || hn::MaxLanes(D()) == 8);

// Where a, 0 <= a < kRange, falls in a piecewise table over [0, kRange): its interval, as
// permute indices, and t in [-0.5, 0.5] within it. Tables with the same range share it.
template <class D>
struct TablePoint {
  hn::Vec<D> t;
  decltype(hn::IndicesFromVec(D(), hn::Zero(hn::RebindToSigned<D>()))) interval;
};

template <class D, class V>
HWY_INLINE TablePoint<D> LocateInTable(D d, V a, float range) {
  constexpr int kIntervals = static_cast<int>(hn::MaxLanes(D()));
  const hn::RebindToSigned<D> di;
  // s - 0.5 = a * kIntervals / range - 0.5 (a power of two: the product is exact), rounded to
  // the nearest integer by adding 1.5 * 2^23, which leaves the integer, the interval, in the
  // low mantissa bits. Where s is an integer (a tie) the interval below may be picked, with
  // t = 0.5: its polynomial was fitted on the closed interval. s - 0.5 rounds only for s < 1,
  // by less than 2^-25.
  const V magic = Splat(d, 12582912.0);
  const V centered = hn::MulAdd(a, Splat(d, kIntervals / range), Splat(d, -0.5));
  const V shifted = hn::Add(centered, magic);
  return {hn::Sub(centered, hn::Sub(shifted, magic)),
          hn::IndicesFromVec(d, hn::And(hn::BitCast(di, shifted), hn::Set(di, kIntervals - 1)))};
}

// Table's function at the point: the polynomial of its interval, the coefficients picked lane
// by lane. With LocateInTable about 20 operations, where the exp-based forms take 30-40.
template <class Table, class D>
HWY_INLINE hn::Vec<D> EvaluateTable(D d, const TablePoint<D>& at) {
  auto coefficient = [&](int k) { return hn::TableLookupLanes(hn::Load(d, Table::kCoefficients[k]), at.interval); };
  hn::Vec<D> p = coefficient(Table::kDegree);
  for (int k = Table::kDegree - 1; k >= 0; --k) p = hn::MulAdd(p, at.t, coefficient(k));
  return p;
}

// Table's function at a, for 0 <= a < Table::kRange.
template <class Table, class D, class V>
HWY_INLINE V Piecewise(D d, V a) {
  return EvaluateTable<Table>(d, LocateInTable(d, a, Table::kRange));
}

// The lanes of a (|x|) inside a table of that range (NaN: outside). Callers take the table's
// form lane by lane: the tabled result where every lane is inside (the common case, one branch),
// else IfThenElse(inside, tabled, general form). Never one form for a whole vector: a lane
// outside would give its neighbours the general form's results, a few ulp off the table's, so a
// value's result would depend on where a row's tail or a thread's share begins and on the
// shape, and a fused epilogue would not match the standalone op bit for bit. The lanes outside
// evaluate some interval's polynomial far from it (finite, inf or NaN, never a subnormal) and
// are dropped.
template <class D, class V>
HWY_INLINE auto InTable(D d, V a, float range) {
  return hn::Lt(a, Splat(d, range));
}

}  // namespace opforge::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_CPU_PIECEWISE_INL_H_
