// exp(x) for x <= 0, the exponential the CPU kernels spend most of their float compute in
// (softmax, silu, gelu). Floats use Cephes' expf: a Cody-Waite reduction x = n ln 2 + r, a
// degree-6 polynomial in r (~1 ulp), then the scaling by 2^n; about two thirds of the work of
// Highway's general Exp. Doubles use Highway's Exp (1 ulp).
//
// Two variants share the reduction and the polynomial but round n and assemble the result
// differently, so their floats differ in the last bit now and then. Each op keeps the one its
// results were made with, and the names say which is which:
//   ExpNonPositiveRound (softmax): n by Round, 2^n added to the exponent bits;
//   ExpNonPositiveMagic (activations): n by adding a magic constant in the FMA, 2^n multiplied.
// Re-included once per Highway target, like the kernels using it.
#if defined(OPFORGE_CPU_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_CPU_EXP_INL_H_
#undef OPFORGE_CPU_EXP_INL_H_
#else
#define OPFORGE_CPU_EXP_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <limits>

HWY_BEFORE_NAMESPACE();
namespace opforge::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// v as a vector of d's lane type (the float32 constants below are exact as doubles).
template <class D>
HWY_INLINE hn::Vec<D> Splat(D d, double v) {
  return hn::Set(d, static_cast<hn::TFromD<D>>(v));
}

// r = x - n ln 2, with ln 2 in two parts: n times the first (few bits) is exact.
template <class D, class V>
HWY_INLINE V ReduceLn2(D d, V n, V x) {
  const V r = hn::MulAdd(n, Splat(d, -0.693359375), x);
  return hn::MulAdd(n, Splat(d, 2.12194440e-4), r);
}

// Cephes' expf polynomial P: exp(r) ~ 1 + r + r^2 P(r) for |r| <= ln 2 / 2, by Horner.
template <class D, class V>
HWY_INLINE V ExpPolynomial(D d, V r) {
  V p = hn::MulAdd(Splat(d, 1.9875691500e-4), r, Splat(d, 1.3981999507e-3));
  p = hn::MulAdd(p, r, Splat(d, 8.3334519073e-3));
  p = hn::MulAdd(p, r, Splat(d, 4.1665795894e-2));
  p = hn::MulAdd(p, r, Splat(d, 1.6666665459e-1));
  return hn::MulAdd(p, r, Splat(d, 5.0000001201e-1));
}

// exp(t) for t <= 0, any t: -inf gives 0, and so does NaN in float64 (in float32 a tiny
// number: Max returns the non-NaN operand on every target); softmax discards rows holding
// NaN. Float results below 4.5e-38 flush to 0 (softmax adds them to a sum >= 1).
template <class D>
HWY_INLINE hn::Vec<D> ExpNonPositiveRound(D d, hn::Vec<D> t) {
  using C = hn::TFromD<D>;
  if constexpr (sizeof(C) == 4) {
    const hn::RebindToSigned<D> di;
    const auto cut = Splat(d, -86.0);  // exp(-86) = 4.5e-38: k stays >= -125
    const auto tc = hn::Max(t, cut);
    const auto k = hn::Round(hn::Mul(tc, Splat(d, 1.44269504088896341)));
    const auto r = ReduceLn2(d, k, tc);
    const auto p = hn::MulAdd(ExpPolynomial(d, r), hn::Mul(r, r), hn::Add(r, Splat(d, 1.0)));
    const auto scaled = hn::Add(hn::BitCast(di, p), hn::ShiftLeft<23>(hn::ConvertTo(di, k)));
    return hn::IfThenZeroElse(hn::Lt(t, cut), hn::BitCast(d, scaled));
  } else {
    return hn::Exp(d, hn::Max(t, hn::Set(d, std::numeric_limits<C>::lowest())));
  }
}

// exp(x) for x <= 88: the callers' arguments are -|x|-like, at most a rounding error above 0
// (NaN in: unspecified out; every caller multiplies the result by x or by a NaN).
// Float: 2^n built straight from the rounding constant's low bits; results below 2^-126 flush
// to 0. About 20 operations, a third faster than Highway's Exp, which dominated silu's cost.
template <class D, class V>
HWY_INLINE V ExpNonPositiveMagic(D d, V x) {
  if constexpr (sizeof(hn::TFromD<D>) == 4) {
    const hn::RebindToSigned<D> di;
    const V low = Splat(d, -87.33654475);  // ln(2^-126)
    // Lanes below it (zeroed at the end) compute exp(0), not exp(low): there p * 2^-126 has p
    // just under 1, a subnormal product, and every instruction that makes one takes a microcode
    // assist (~150 cycles on Intel), flags or no flags: gelu ran 10x slower past |x| = 13.3
    // (its exp(-x^2 / 2)) and silu past |x| = 87.3 (tests/cpp/test_subnormals.cc).
    const auto below = hn::Lt(x, low);
    const V xc = hn::IfThenZeroElse(below, x);
    const V magic = Splat(d, 12582912.0);  // 1.5 * 2^23: adding it rounds to an integer
    const V shifted = hn::MulAdd(xc, Splat(d, 1.44269504088896341), magic);
    const V n = hn::Sub(shifted, magic);
    const V r = ReduceLn2(d, n, xc);
    const V p = hn::Add(hn::MulAdd(ExpPolynomial(d, r), hn::Mul(r, r), r), Splat(d, 1.0));
    // n + 127 sits in the low bits of `shifted` (n >= -126), so 2^n is one add and one shift.
    const auto bits = hn::Sub(hn::BitCast(di, shifted), hn::BitCast(di, hn::Sub(magic, Splat(d, 127.0))));
    const V scaled = hn::Mul(p, hn::BitCast(d, hn::ShiftLeft<23>(bits)));
    return hn::IfThenZeroElse(below, scaled);
  } else {
    return hn::Exp(d, x);
  }
}

}  // namespace opforge::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_CPU_EXP_INL_H_
