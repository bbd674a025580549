// Per-target quantization of one 32-value block into ggml's Q8_0 and Q4_0, byte-identical to
// ggml's reference quantizer (quantize_row_q8_0_ref, quantize_row_q4_0_ref) on every target.
// Re-included once per Highway target, like the kernels using it.
//
// Exactness rules every line here follows:
// - The absolute maximum is taken on the float bits with the sign cleared: for non-NaN floats
//   unsigned order is magnitude order, so it equals ggml's fabsf/MAX loop, and it is the same
//   on every target (a NaN in a block gives a NaN scale: such blocks are garbage in ggml too).
// - No product ever feeds an addition in float32: GCC contracts a*b+c into an FMA (one
//   rounding instead of ggml's two) wherever the target has FMA, and would change rare quants.
//   roundf is built from Trunc and a comparison; Q4_0's "+ 8.5f" is done in double (exact)
//   and rounded to float once, which is what the float32 addition does.
// Checked against ggml's own C (quantize_row_q8_0_ref, _q4_0_ref of ggml-org/ggml d99724f,
// compiled with -ffp-contract=off) on 8M values of scales 1e-4..1e4: the same bytes on every
// target. ggml built with -march=native itself differs from that in about 1 Q4_0 block in
// 65,000, because GCC fuses its x * id + 8.5f.
#if defined(OPFORGE_CPU_GGML_QUANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_CPU_GGML_QUANT_INL_H_
#undef OPFORGE_CPU_GGML_QUANT_INL_H_
#else
#define OPFORGE_CPU_GGML_QUANT_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>

#include "opforge/cpu/ggml_quant.h"
#include "opforge/cpu/simd-inl.h"
#include "opforge/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Bits of max |x| over the block's 32 values (|x| as float bits, sign cleared).
template <typename T>
HWY_INLINE uint32_t AbsMaxBits(const T* HWY_RESTRICT x) {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const auto magnitude = hn::Set(du, 0x7fffffffu);
  auto m = hn::Zero(du);
  for (int64_t i = 0; i < quant::kBlock; i += static_cast<int64_t>(hn::Lanes(d)))
    m = hn::Max(m, hn::And(hn::BitCast(du, LoadAs(d, x + i)), magnitude));
  return hn::GetLane(hn::MaxOfLanes(du, m));
}

// Q8_0: q = roundf(x * id) into q[0..31]; returns the unrounded scale d = amax / 127.
template <typename T>
HWY_INLINE float QuantizeBlockQ8_0(const T* HWY_RESTRICT x, int8_t* HWY_RESTRICT q) {
  const float d = quant::scale_q8_0(bits_to_float(AbsMaxBits(x)));
  const hn::ScalableTag<float> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const auto id = hn::Set(df, quant::inverse_scale(d));
  const auto half = hn::Set(df, 0.5f), one = hn::Set(df, 1.0f);
  for (int64_t i = 0; i < quant::kBlock; i += static_cast<int64_t>(hn::Lanes(df))) {
    const auto p = hn::Mul(LoadAs(df, x + i), id);
    const auto t = hn::Trunc(p);
    // roundf: away from zero when |p| >= |t| + 0.5 (exact: |t| < 2^23 or p is integral).
    const auto up = hn::Ge(hn::Abs(p), hn::Add(hn::Abs(t), half));
    const auto r = hn::IfThenElse(up, hn::Add(t, hn::CopySign(one, p)), t);
    hn::StoreU(hn::DemoteTo(d8, hn::ConvertTo(di, r)), d8, q + i);
  }
  return d;
}

// Q4_0: qs[j] = q[j] | q[j + 16] << 4 with q = min(15, (int8_t)(x * id + 8.5f)); returns the
// unrounded scale d = max / -8, max being the first value of largest magnitude (ggml's strict
// `amax < fabsf(v)` keeps the first), +0 for an all-zero block.
template <typename T>
HWY_INLINE float QuantizeBlockQ4_0(const T* HWY_RESTRICT x, uint8_t* HWY_RESTRICT qs) {
  const uint32_t amax = AbsMaxBits(x);
  float max = 0.0f;
  if (amax != 0) {
    const hn::ScalableTag<float> dv;
    const hn::RebindToUnsigned<decltype(dv)> du;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(dv));
    // Last vector first, so the earliest hit wins without a data-dependent branch.
    int64_t first = 0;
    for (int64_t i = quant::kBlock - lanes; i >= 0; i -= lanes) {
      const auto bits = hn::And(hn::BitCast(du, LoadAs(dv, x + i)), hn::Set(du, 0x7fffffffu));
      const intptr_t hit = hn::FindFirstTrue(du, hn::Eq(bits, hn::Set(du, amax)));
      first = hit >= 0 ? i + hit : first;
    }
    max = ToCompute(x[first]);
  }
  const float d = quant::scale_q4_0(max);
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const hn::Rebind<int32_t, decltype(dd)> di;
  const hn::Rebind<uint8_t, decltype(dd)> d8;
  const auto id = hn::Set(df, quant::inverse_scale(d));
  const auto quantize = [&](const T* p) {
    const auto shifted = hn::DemoteTo(df, hn::Add(hn::PromoteTo(dd, hn::Mul(LoadAs(df, p), id)), hn::Set(dd, 8.5)));
    return hn::Min(hn::ConvertTo(di, shifted), hn::Set(di, 15));
  };
  constexpr int64_t kHalf = quant::kBlock / 2;
  for (int64_t j = 0; j < kHalf; j += static_cast<int64_t>(hn::Lanes(dd))) {
    const auto packed = hn::Or(quantize(x + j), hn::ShiftLeft<4>(quantize(x + j + kHalf)));
    hn::StoreU(hn::DemoteTo(d8, packed), d8, qs + j);
  }
  return d;
}

// x: [..., k] (any strides, k % 32 == 0) -> out: [..., k / 32 * block_bytes], contiguous, in
// ggml's byte layout. Parallel over all blocks of all rows, so one long row splits too.
template <quant::Format F, typename T>
void QuantizeRows(const TensorView& x, const TensorView& out) {
  const int64_t k = x.size(-1), nb = k / quant::kBlock, bytes = quant::block_bytes(F);
  if (nb == 0) return;
  const int64_t inner = x.stride(-1);
  uint8_t* dst = out.data_as<uint8_t>();
  parallel_for(x.numel() / quant::kBlock, 512, [&](int64_t begin, int64_t end) {
    T gathered[quant::kBlock];
    quant::for_each_block<T>(x, quant::kBlock, begin, end, [&](int64_t g, const T* block) {
      if (inner != 1) {
        for (int64_t j = 0; j < quant::kBlock; ++j) gathered[j] = block[j * inner];
        block = gathered;
      }
      uint8_t* o = dst + g * bytes;
      float d;
      if constexpr (F == quant::Format::q8_0)
        d = QuantizeBlockQ8_0(block, reinterpret_cast<int8_t*>(o + 2));
      else
        d = QuantizeBlockQ4_0(block, o + 2);
      quant::store_scale(o, to_float16(d));
    });
  });
}

}  // namespace opforge::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_CPU_GGML_QUANT_INL_H_
