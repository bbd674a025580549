// Activation functions and their derivatives as SIMD functors, for the elementwise activation
// ops and for fused epilogues. Forward functors map (d, x) -> f(x); gradient functors map
// (d, g, x) -> g * f'(x). Re-included once per Highway target, like the kernels using it.
//
// MapUnary and MapBinary feed the functors whole vectors only: tails and strided operands go
// through a lane buffer, so every element gets the same arithmetic wherever it sits in the
// call (no scalar twin that rounds differently).
//
// Large |x|: exponentials (ExpNonPositiveMagic, from exp-inl.h) only see arguments <= 0 (no
// overflow), and products of x with a factor that vanishes clamp x first, so +-inf give the
// limits (gelu(-inf) = 0, silu'(inf) = 1, ...) where the naive formulas give NaN; NaN stays NaN.
#if defined(OPFORGE_CPU_ACTIVATION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_CPU_ACTIVATION_INL_H_
#undef OPFORGE_CPU_ACTIVATION_INL_H_
#else
#define OPFORGE_CPU_ACTIVATION_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "opforge/cpu/exp-inl.h"
#include "opforge/cpu/piecewise-inl.h"
#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"
#include "opforge/cpu/transpose-inl.h"
#include "opforge/cpu/visit.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// x, with values below -limit (-inf included) raised to -limit; NaN passes through, which
// Max would not guarantee on every target.
template <class D, class V>
HWY_INLINE V ClampBelow(D d, V x, double limit) {
  const V low = Splat(d, -limit);
  return hn::IfThenElse(hn::Lt(x, low), low, x);
}

// x clamped to [-limit, limit]; NaN passes through.
template <class D, class V>
HWY_INLINE V ClampAbs(D d, V x, double limit) {
  const V lim = Splat(d, limit);
  return hn::IfThenElse(hn::Gt(hn::Abs(x), lim), hn::CopySign(lim, x), x);
}

// 1 / a for a in [1, 2^100]. float: the hardware estimate and Newton steps (within about an
// ulp): short operations on the FMA ports instead of a long-latency division that would
// lengthen the already long dependency chains. Each step doubles the estimate's good bits:
// x86's (rcp14ps, rcpps) has 12-14, one step is enough; Arm's (FRECPE) has 8 and needs two (one
// left silu 50x less accurate there). double: a division.
inline constexpr int kReciprocalSteps = HWY_ARCH_ARM ? 2 : 1;

template <class D, class V>
HWY_INLINE V Reciprocal(D d, V a) {
  if constexpr (sizeof(hn::TFromD<D>) == 4) {
    V r = hn::ApproximateReciprocal(a);
    for (int i = 0; i < kReciprocalSteps; ++i) r = hn::MulAdd(hn::NegMulAdd(a, r, Splat(d, 1.0)), r, r);
    return r;
  } else {
    return hn::Div(Splat(d, 1.0), a);
  }
}

// sigmoid(-a) and sigmoid(a) from e = exp(-a), a >= 0 or NaN: e / (1 + e) and 1 / (1 + e).
template <class D, class V>
HWY_INLINE void SigmoidFromExp(D d, V a, V& left, V& right) {
  const V e = ExpNonPositiveMagic(d, hn::Neg(a));
  right = Reciprocal(d, hn::Add(Splat(d, 1.0), e));
  left = hn::Mul(e, right);
}

// sigmoid(x) and sigmoid(-x) = 1 - sigmoid(x), both without cancellation: from the tabulated
// sigmoid(-|x|) and 1 minus it where |x| is inside the table's range, from SigmoidFromExp
// elsewhere (NaN included); lane by lane (see InTable).
template <class D, class V>
HWY_INLINE void SigmoidPair(D d, V x, V& s, V& s_neg) {
  const V a = hn::Abs(x);
  V left, right;  // sigmoid(-|x|), sigmoid(|x|)
  if constexpr (kHasPiecewiseTables<D>) {
    using Table = SigmoidLeftTable<static_cast<int>(hn::MaxLanes(D()))>;
    const auto inside = InTable(d, a, Table::kRange);
    left = Piecewise<Table>(d, a);
    right = hn::Sub(Splat(d, 1.0), left);
    if (HWY_UNLIKELY(!hn::AllTrue(d, inside))) {
      V exp_left, exp_right;
      SigmoidFromExp(d, a, exp_left, exp_right);
      left = hn::IfThenElse(inside, left, exp_left);
      right = hn::IfThenElse(inside, right, exp_right);
    }
  } else {
    SigmoidFromExp(d, a, left, right);
  }
  const auto negative = hn::Lt(x, hn::Zero(d));
  s = hn::IfThenElse(negative, left, right);
  s_neg = hn::IfThenElse(negative, right, left);
}

// Float: 2^24 Phi(-|x|) = 2^24 erfc(|z|) / 2, z = x / sqrt(2), by Numerical Recipes' erfcc
// (Chebyshev fit, relative error below 1.2e-7 on all of [0, inf)), so Phi keeps its relative
// accuracy in the far left tail; about 40 operations. Scaled by 2^24 (exactly) so that it is a
// normal float wherever it is not 0 (exp flushes below 2^-126, and h > 2^-6): Phi itself is
// subnormal for |x| in [12.9, 13.3], and every instruction that makes a subnormal float takes a
// microcode assist of ~150 cycles on Intel, which made gelu on such inputs 10x slower. The
// callers unscale last, where the result itself is normal.
inline constexpr double kCdfScale = 16777216.0;  // 2^24

template <class D, class V>
HWY_INLINE V ScaledLeftNormalCdf(D d, V x) {
  // In h = t / 2 = 1 / (2 + z), z = |x| / sqrt(2), with the coefficients scaled by 2^k to
  // match (exact), t * exp(...) / 2 is h * exp(...). |x| is capped so the reciprocal never
  // sees inf.
  const V ax = hn::Min(hn::Abs(x), Splat(d, 64.0));
  const V h = Reciprocal(d, hn::MulAdd(ax, Splat(d, 0.70710678118654752440), Splat(d, 2.0)));
  // Estrin's scheme: the same polynomial with a shorter dependency chain than Horner's.
  const V h2 = hn::Mul(h, h), h4 = hn::Mul(h2, h2);
  auto pair = [&](double c0, double c1) { return hn::MulAdd(h, Splat(d, c1), Splat(d, c0)); };
  const V low = hn::MulAdd(h2, pair(0.37409196 * 4, 0.09678418 * 8), pair(-1.26551223, 1.00002368 * 2));
  const V mid = hn::MulAdd(h2, pair(-1.13520398 * 64, 1.48851587 * 128), pair(-0.18628806 * 16, 0.27886807 * 32));
  const V p = hn::MulAdd(h4, hn::MulAdd(h4, pair(-0.82215223 * 256, 0.17087277 * 512), mid), low);
  // -z^2 as -(x / 2) * x: one rounding (in the FMA) instead of two, since for |x| past a few
  // units the exponent's rounding is the largest error left.
  return hn::Mul(hn::Mul(h, Splat(d, kCdfScale)),
                 ExpNonPositiveMagic(d, hn::NegMulAdd(hn::Mul(x, Splat(d, 0.5)), x, p)));
}

// 1 - Phi(-|x|) (x >= 0) from ScaledLeftNormalCdf's 2^24 Phi(-|x|). Below 2^-36 that is raised
// to 2^-36: the difference rounds to 1 either way, and the product with 2^-24, which targets
// without FMA round on its own, stays normal.
template <class D, class V>
HWY_INLINE V OneMinusUnscaled(D d, V scaled) {
  return hn::NegMulAdd(hn::Max(scaled, Splat(d, 0x1p-36)), Splat(d, 1.0 / kCdfScale), Splat(d, 1.0));
}

// m * Phi(x) for any x, Phi the standard normal CDF, Phi(x) = erfc(-x / sqrt(2)) / 2. float:
// from ScaledLeftNormalCdf, unscaled after the product with m, so nothing on the way is
// subnormal unless m * Phi(x) is. double: std::erfc lane by lane (Highway 1.0.3 has no vector
// erf; float64 needs ~1e-15).
template <class D, class V>
HWY_INLINE V TimesNormalCdfAnyX(D d, V m, V x) {
  using T = hn::TFromD<D>;
  if constexpr (sizeof(T) == 8) {
    HWY_ALIGN T lanes[HWY_MAX_BYTES / sizeof(T)];
    hn::Store(x, d, lanes);
    for (size_t i = 0; i < hn::Lanes(d); ++i) lanes[i] = 0.5 * std::erfc(-lanes[i] * 0.70710678118654752440);
    return hn::Mul(m, hn::Load(d, lanes));
  } else {
    const V scaled = ScaledLeftNormalCdf(d, x), unscale = Splat(d, 1.0 / kCdfScale);
    const auto negative = hn::Lt(x, hn::Zero(d));
    // x < 0: m Phi(-|x|); the other lanes' m zeroed, or their product could be the subnormal.
    const V left = hn::Mul(hn::Mul(hn::IfThenElseZero(negative, m), scaled), unscale);
    const V right = hn::Mul(m, OneMinusUnscaled(d, scaled));
    return hn::IfThenElse(negative, left, right);
  }
}

// m * Phi(x): Phi from the tabulated polynomials where |x| is inside their range (nearly every
// lane of typical activations), from the erfc path elsewhere (NaN included); lane by lane.
template <class D, class V>
HWY_INLINE V TimesNormalCdf(D d, V m, V x) {
  if constexpr (kHasPiecewiseTables<D>) {
    using Table = NormalCdfLeftTable<static_cast<int>(hn::MaxLanes(D()))>;
    const V a = hn::Abs(x);
    const auto inside = InTable(d, a, Table::kRange);
    // Phi(x) = 1 - Phi(-x) for x >= 0, where absolute accuracy is relative accuracy.
    const V left = Piecewise<Table>(d, a);
    const V tabled = hn::Mul(m, hn::IfThenElse(hn::Lt(x, hn::Zero(d)), left, hn::Sub(Splat(d, 1.0), left)));
    if (HWY_LIKELY(hn::AllTrue(d, inside))) return tabled;
    return hn::IfThenElse(inside, tabled, TimesNormalCdfAnyX(d, m, x));
  }
  return TimesNormalCdfAnyX(d, m, x);
}

// Past these |x| every result equals its limit in float64 and float32 alike.
inline constexpr double kSiluLimit = 1000.0;  // exp(-1000) is 0 in both
inline constexpr double kGeluLimit = 40.0;    // Phi(-40) and exp(-40^2 / 2) are 0 in both

// relu(x) = max(x, 0), keeping NaN.
struct Relu {
  template <class D, class V>
  HWY_INLINE V operator()(D d, V x) const { return hn::IfThenZeroElse(hn::Le(x, hn::Zero(d)), x); }
};

// As torch's threshold_backward: 0 where x <= 0, else g (x NaN passes g).
struct ReluGrad {
  template <class D, class V>
  HWY_INLINE V operator()(D d, V g, V x) const { return hn::IfThenZeroElse(hn::Le(x, hn::Zero(d)), g); }
};

// silu(x) = x * sigmoid(x).
struct Silu {
  template <class D, class V>
  HWY_INLINE V operator()(D d, V x) const {
    const V xl = ClampBelow(d, x, kSiluLimit);
    V s, s_neg;
    SigmoidPair(d, xl, s, s_neg);
    return hn::Mul(xl, s);
  }
};

// silu'(x) = sigmoid(x) * (1 + x * sigmoid(-x)).
struct SiluGrad {
  template <class D, class V>
  HWY_INLINE V operator()(D d, V g, V x) const {
    const V xc = ClampAbs(d, x, kSiluLimit);
    V s, s_neg;
    SigmoidPair(d, xc, s, s_neg);
    return hn::Mul(g, hn::Mul(s, hn::MulAdd(xc, s_neg, Splat(d, 1.0))));
  }
};

// gelu(x) = x * Phi(x), the exact (erf) form.
struct GeluErf {
  template <class D, class V>
  HWY_INLINE V operator()(D d, V x) const {
    return TimesNormalCdf(d, ClampBelow(d, x, kGeluLimit), x);
  }
};

// gelu'(x) = Phi(x) + x * phi(x), phi the standard normal density; Phi and phi from their
// tables (one lookup of the interval for both) where |x| is inside them, lane by lane.
struct GeluErfGrad {
  template <class D, class V>
  HWY_INLINE V operator()(D d, V g, V x) const {
    if constexpr (kHasPiecewiseTables<D>) {
      constexpr int kLanes = static_cast<int>(hn::MaxLanes(D()));
      using Cdf = NormalCdfLeftTable<kLanes>;
      using Pdf = NormalPdfTable<kLanes>;
      static_assert(Cdf::kRange == Pdf::kRange);
      const V a = hn::Abs(x);
      const auto inside = InTable(d, a, Cdf::kRange);
      const TablePoint<D> at = LocateInTable(d, a, Cdf::kRange);
      const V left = EvaluateTable<Cdf>(d, at);
      const V cdf = hn::IfThenElse(hn::Lt(x, hn::Zero(d)), left, hn::Sub(Splat(d, 1.0), left));
      const V tabled = hn::Mul(g, hn::MulAdd(x, EvaluateTable<Pdf>(d, at), cdf));
      if (HWY_LIKELY(hn::AllTrue(d, inside))) return tabled;
      return hn::IfThenElse(inside, tabled, AnyX(d, g, x));
    }
    return AnyX(d, g, x);
  }

  // From exp and ScaledLeftNormalCdf (float) or std::erfc (double): any x.
  template <class D, class V>
  HWY_INLINE static V AnyX(D d, V g, V x) {
    const V xc = ClampAbs(d, x, kGeluLimit);
    // float: Phi and phi both scaled by 2^24 (see ScaledLeftNormalCdf) and unscaled last.
    constexpr bool kScaled = sizeof(hn::TFromD<D>) == 4;
    const V density = hn::Mul(ExpNonPositiveMagic(d, hn::Mul(hn::Mul(xc, xc), Splat(d, -0.5))),
                              Splat(d, 0.39894228040143267794 * (kScaled ? kCdfScale : 1.0)));  // 1 / sqrt(2 pi)
    if constexpr (!kScaled) {
      return hn::Mul(g, hn::MulAdd(xc, density, TimesNormalCdfAnyX(d, Splat(d, 1.0), xc)));
    } else {
      const V scaled = ScaledLeftNormalCdf(d, xc), unscale = Splat(d, 1.0 / kCdfScale);
      const auto negative = hn::Lt(xc, hn::Zero(d));
      // x < 0: Phi(x) + x phi(x), both tiny: the sum scaled, times g, then unscaled.
      const V left = hn::Mul(hn::Mul(g, hn::IfThenElseZero(negative, hn::MulAdd(xc, density, scaled))), unscale);
      // x >= 0: 1 - Phi(-x) + x phi(x), x phi(x) from x / 2^24 (exact) and the scaled density.
      const V right = hn::Mul(g, hn::MulAdd(hn::Mul(xc, unscale), density, OneMinusUnscaled(d, scaled)));
      return hn::IfThenElse(negative, left, right);
    }
  }
};

// The tanh approximation 0.5 * x * (1 + tanh(u)), u = sqrt(2/pi) * (x + 0.044715 x^3),
// computed as x * sigmoid(2u), which is the same function without the cancellation of
// 1 + tanh(u) for negative u. Returns 2u and its derivative 2u'.
template <class D, class V>
HWY_INLINE V GeluTanhArg(D d, V x, V* slope = nullptr) {
  const V k0 = Splat(d, 1.59576912160573071176);                   // 2 sqrt(2/pi)
  const V k1 = Splat(d, 1.59576912160573071176 * 0.044715);
  const V x2 = hn::Mul(x, x);
  if (slope) *slope = hn::MulAdd(hn::Mul(k1, Splat(d, 3.0)), x2, k0);
  return hn::Mul(x, hn::MulAdd(k1, x2, k0));
}

struct GeluTanh {
  template <class D, class V>
  HWY_INLINE V operator()(D d, V x) const {
    const V xl = ClampBelow(d, x, kGeluLimit);
    V s, s_neg;
    SigmoidPair(d, GeluTanhArg(d, xl), s, s_neg);
    return hn::Mul(xl, s);
  }
};

// d/dx x * sigmoid(2u) = s * (1 + x * (1 - s) * 2u'), s = sigmoid(2u).
struct GeluTanhGrad {
  template <class D, class V>
  HWY_INLINE V operator()(D d, V g, V x) const {
    const V xc = ClampAbs(d, x, kGeluLimit);
    V slope, s, s_neg;
    SigmoidPair(d, GeluTanhArg(d, xc, &slope), s, s_neg);
    return hn::Mul(g, hn::Mul(s, hn::MulAdd(hn::Mul(xc, s_neg), slope, Splat(d, 1.0))));
  }
};

// out[i] = op(d, a[i * sa]) for i < n; out is contiguous.
template <typename T, class Op>
HWY_INLINE void MapUnary(T* HWY_RESTRICT out, const T* HWY_RESTRICT a, int64_t sa, int64_t n, const Op& op) {
  using C = Compute<T>;
  const hn::ScalableTag<C> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  if (sa == 1) {
    // Two vectors per step: their long independent chains (exp, polynomials) overlap better.
    for (; i + 2 * lanes <= n; i += 2 * lanes) {
      const auto v0 = op(d, LoadAs(d, a + i));
      const auto v1 = op(d, LoadAs(d, a + i + lanes));
      StoreAs(d, v0, out + i);
      StoreAs(d, v1, out + i + lanes);
    }
    for (; i + lanes <= n; i += lanes) StoreAs(d, op(d, LoadAs(d, a + i)), out + i);
  }
  if (sa != 1 && StridedRow<decltype(d), T>::Takes(d, sa)) {  // a strided row (a slice's)
    const StridedRow<decltype(d), T> row(d, a, sa);
    for (; row.Has(i, n); i += lanes) StoreAs(d, op(d, row.Load(i)), out + i);
  }
  HWY_ALIGN C buf[HWY_MAX_BYTES / sizeof(C)];
  for (; i < n; i += lanes) {
    const int64_t k = std::min(lanes, n - i);
    for (int64_t j = 0; j < lanes; ++j) buf[j] = j < k ? ToCompute(a[(i + j) * sa]) : C(0);
    hn::Store(op(d, hn::Load(d, buf)), d, buf);
    for (int64_t j = 0; j < k; ++j) out[i + j] = FromCompute<T>(buf[j]);
  }
}

// out[i] = op(d, a[i * sa], b[i * sb]) for i < n; out is contiguous.
template <typename T, class Op>
HWY_INLINE void MapBinary(T* HWY_RESTRICT out, const T* HWY_RESTRICT a, int64_t sa, const T* HWY_RESTRICT b,
                          int64_t sb, int64_t n, const Op& op) {
  using C = Compute<T>;
  const hn::ScalableTag<C> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  if (sa == 1 && sb == 1) {
    for (; i + 2 * lanes <= n; i += 2 * lanes) {
      const auto v0 = op(d, LoadAs(d, a + i), LoadAs(d, b + i));
      const auto v1 = op(d, LoadAs(d, a + i + lanes), LoadAs(d, b + i + lanes));
      StoreAs(d, v0, out + i);
      StoreAs(d, v1, out + i + lanes);
    }
    for (; i + lanes <= n; i += lanes) StoreAs(d, op(d, LoadAs(d, a + i), LoadAs(d, b + i)), out + i);
  }
  using Row = StridedRow<decltype(d), T>;
  if ((sa != 1 || sb != 1) && Row::Takes(d, sa) && Row::Takes(d, sb)) {  // strided or broadcast rows
    const Row ra(d, a, sa), rb(d, b, sb);
    for (; ra.Has(i, n) && rb.Has(i, n); i += lanes) StoreAs(d, op(d, ra.Load(i), rb.Load(i)), out + i);
  }
  HWY_ALIGN C buf_a[HWY_MAX_BYTES / sizeof(C)];
  HWY_ALIGN C buf_b[HWY_MAX_BYTES / sizeof(C)];
  for (; i < n; i += lanes) {
    const int64_t k = std::min(lanes, n - i);
    for (int64_t j = 0; j < lanes; ++j) {
      buf_a[j] = j < k ? ToCompute(a[(i + j) * sa]) : C(0);
      buf_b[j] = j < k ? ToCompute(b[(i + j) * sb]) : C(0);
    }
    hn::Store(op(d, hn::Load(d, buf_a), hn::Load(d, buf_b)), d, buf_a);
    for (int64_t j = 0; j < k; ++j) out[i + j] = FromCompute<T>(buf_a[j]);
  }
}

// MapUnary over a block of rows (for_each_row's Rows; operand 0 is out, 1 is a). Contiguous rows
// of whole vectors (narrow slices: x[:, :16] of a wider x) take one loop over the block, without
// MapUnary's per-row set-up, which cost a 16-wide slice's relu 1.8x torch's time; the same op
// on the same vectors, so the same bits.
template <typename T, class Op>
HWY_INLINE void MapUnaryRows(T* HWY_RESTRICT out, const T* HWY_RESTRICT a, const Rows<2>& r, const Op& op) {
  const auto piece = [&](int64_t c, int64_t j, int64_t n) {
    MapUnary(out + r.at(0, c) + j, a + r.at(1, c) + j * r.inner[1], r.inner[1], n, op);
  };
  if (MapSquares<T, 2>(out, {a}, r, op, piece)) return;  // a tile of a transposed x
  if (MapRowPairs<T, 2>(out, {a}, r, op, piece)) return;  // rows of half a vector
  const hn::ScalableTag<Compute<T>> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t ahead = r.count > 1 ? RowsAhead<T>(r.outer[1], r.inner[1], r.len) : 0;
  if (r.count > 1 && r.inner[0] == 1 && r.inner[1] == 1 && r.len % lanes == 0) {
    for (int64_t c = 0; c < r.count; ++c) {
      T* o = out + r.at(0, c);
      const T* x = a + r.at(1, c);
      PrefetchRow(a + r.offsets[1], r.outer[1], c, ahead);
      for (int64_t i = 0; i < r.len; i += lanes) StoreAs(d, op(d, LoadAs(d, x + i)), o + i);
    }
    return;
  }
  EachRowPrefetching<T, 2>({a}, r, piece);
}

// Elements per parallel chunk: enough that waking a worker pays off even for relu.
inline constexpr int64_t kActivationGrain = 1 << 14;

// out = op(x) for a float tensor x of any strides; out is contiguous.
template <class Op>
void ActivationForward(const char* name, const TensorView& x, const TensorView& out, const Op& op) {
  visit_float(x.dtype, name, [&](auto tag) {
    using T = decltype(tag);
    const T* src = x.data_as<const T>();
    T* dst = out.data_as<T>();
    // Blocks of rows (for_each_row's Rows): the loop over a block's rows runs in this target's
    // code, one call from the walker per block instead of one per row.
    for_each_row<2>(out.shape, {contiguous_strides(out.shape), x.strides}, kActivationGrain,
                    [&](const Rows<2>& r) { MapUnaryRows(dst, src, r, op); });
  });
}

// out = op(grad, x), grad and x broadcast against each other to out's shape.
template <class Op>
void ActivationBackward(const char* name, const TensorView& grad, const TensorView& x, const TensorView& out,
                        const Op& op) {
  visit_float(grad.dtype, name, [&](auto tag) {
    using T = decltype(tag);
    const T* g = grad.data_as<const T>();
    const T* src = x.data_as<const T>();
    T* dst = out.data_as<T>();
    for_each_row<3>(out.shape,
                    {contiguous_strides(out.shape), broadcast_strides(grad, out.shape), broadcast_strides(x, out.shape)},
                    kActivationGrain, [&](const Rows<3>& r) {
                      const auto piece = [&](int64_t c, int64_t j, int64_t n) {
                        MapBinary(dst + r.at(0, c) + j, g + r.at(1, c) + j * r.inner[1], r.inner[1],
                                  src + r.at(2, c) + j * r.inner[2], r.inner[2], n, op);
                      };
                      if (MapSquares<T, 3>(dst, {g, src}, r, op, piece)) return;  // a transposed input's tile
                      if (MapRowPairs<T, 3>(dst, {g, src}, r, op, piece)) return;  // rows of half a vector
                      EachRowPrefetching<T, 3>({g, src}, r, piece);
                    });
  });
}

}  // namespace opforge::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_CPU_ACTIVATION_INL_H_
