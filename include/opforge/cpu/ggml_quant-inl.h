// Per-target quantization of one 32-value block into ggml's Q8_0 and Q4_0, byte-identical to
// ggml's reference quantizer (quantize_row_q8_0_ref, quantize_row_q4_0_ref) on every target.
// Re-included once per Highway target, like the kernels using it.
//
// Exactness rules every line here follows:
// - The absolute maximum is taken on the float bits with the sign cleared: for non-NaN floats
//   unsigned order is magnitude order, so it equals ggml's fabsf/MAX loop, and it is the same
//   on every target (a NaN in a block gives a NaN scale: such blocks are garbage in ggml too).
// - A product that feeds an addition goes through Rounded(): GCC contracts a*b+c into an FMA
//   (one rounding instead of ggml's two) wherever the target has FMA, which would change rare
//   quants (opforge builds with -ffp-contract=off now; Rounded() keeps the bytes under any
//   flags). roundf is built from Trunc and a comparison.
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
#include "opforge/cpu/rows-inl.h"
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

// v, opaque to the optimizer: a product passed through it cannot be contracted with the
// addition that follows into an FMA. Only the x86 and Arm SIMD targets have FMA to contract into.
template <class V>
HWY_INLINE V Rounded(V v) {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR
  asm("" : "+v"(v.raw));
#elif HWY_ARCH_ARM_A64 && HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR
  asm("" : "+w"(v.raw));
#endif
  return v;
}

// An integral float v (|v| < 2^22) as uint32 lanes whose low byte is v's two's-complement byte:
// 1.5 * 2^23 + v holds v in its low mantissa bits, exactly. Cheaper than a float -> int
// conversion, to which Highway adds overflow fix-ups on x86 that cost as much as the rest.
template <class D, class V>
HWY_INLINE auto IntegralLowBits(D d, V v) {
  return hn::BitCast(hn::RebindToUnsigned<D>(), hn::Add(v, hn::Set(d, 12582912.0f)));
}

// Q8_0 quants q = roundf(x * id) into q[0..31].
template <typename T>
HWY_INLINE void QuantsQ8_0(const T* HWY_RESTRICT x, float id, int8_t* HWY_RESTRICT q) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const auto vid = hn::Set(df, id);
  // roundf(p) = trunc(p + copysign(0.5 - 2^-25, p)) for every float |p| < 128 (checked on all
  // of them): the sum is exact or rounds without crossing an integer, and the constant's last
  // bit keeps p = 0.5 - 2^-25 from summing to 1.
  const auto half_down = hn::Set(df, 0x1.fffffep-2f);
  for (int64_t i = 0; i < quant::kBlock; i += static_cast<int64_t>(hn::Lanes(df))) {
    const auto p = Rounded(hn::Mul(LoadAs(df, x + i), vid));
    const auto r = hn::Trunc(hn::Add(p, hn::CopySign(half_down, p)));
    hn::StoreU(hn::TruncateTo(d8, IntegralLowBits(df, r)), d8, reinterpret_cast<uint8_t*>(q + i));
  }
}

// Q4_0 quants qs[j] = q[j] | q[j + 16] << 4 with q = min(15, (int8_t)(x * id + 8.5f)), the
// product rounded to float before the sum as in ggml.
template <typename T>
HWY_INLINE void QuantsQ4_0(const T* HWY_RESTRICT x, float id, uint8_t* HWY_RESTRICT qs) {
  constexpr int64_t kHalf = quant::kBlock / 2;
  const hn::CappedTag<float, kHalf> df;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const auto vid = hn::Set(df, id), shift = hn::Set(df, 8.5f), top = hn::Set(df, 15.0f);
  // x * id + 8.5 >= 0.5 (|x * id| <= 8), so Trunc is the int8 cast.
  const auto quantize = [&](const T* p) {
    return IntegralLowBits(df, hn::Min(hn::Trunc(hn::Add(Rounded(hn::Mul(LoadAs(df, p), vid)), shift)), top));
  };
  for (int64_t j = 0; j < kHalf; j += static_cast<int64_t>(hn::Lanes(df))) {
    const auto packed = hn::Or(quantize(x + j), hn::ShiftLeft<4>(quantize(x + j + kHalf)));
    hn::StoreU(hn::TruncateTo(d8, packed), d8, qs + j);
  }
}

// Q4_0's max: the first value of largest magnitude (ggml's strict `amax < fabsf(v)` keeps the
// first), +0 for an all-zero block; amax is AbsMaxBits(x).
template <typename T>
HWY_INLINE float SignedMaxQ4_0(const T* HWY_RESTRICT x, uint32_t amax) {
  if (amax == 0) return 0.0f;
  const hn::ScalableTag<float> dv;
  const hn::RebindToUnsigned<decltype(dv)> du;
  const size_t lanes = hn::Lanes(dv);
  // One bit per value with |x| == amax, then the lowest: no data-dependent branch (which value
  // is the largest is a coin toss, and a mispredicted branch per block stalled the whole loop).
  uint32_t hits = 0;
  for (size_t i = 0; i < quant::kBlock; i += lanes) {
    const auto bits = hn::And(hn::BitCast(du, LoadAs(dv, x + i)), hn::Set(du, 0x7fffffffu));
    uint8_t mask[8] = {};
    const size_t bytes = hn::StoreMaskBits(du, hn::Eq(bits, hn::Set(du, amax)), mask);
    // Byte by byte: a wider load than the mask's store could not be forwarded from it.
    for (size_t b = 0; b < bytes; ++b) hits |= uint32_t{mask[b]} << (i + 8 * b);
  }
  return ToCompute(x[hwy::Num0BitsBelowLS1Bit_Nonzero32(hits)]);
}

// Q8_0 of one block into q[0..31]; returns the unrounded scale d = amax / 127.
template <typename T>
HWY_INLINE float QuantizeBlockQ8_0(const T* HWY_RESTRICT x, int8_t* HWY_RESTRICT q) {
  const float d = quant::scale_q8_0(bits_to_float(AbsMaxBits(x)));
  QuantsQ8_0(x, quant::inverse_scale(d), q);
  return d;
}

// Lane b of the result: the largest lane of v[b] (unsigned), for the Lanes(du) vectors v[0..]
// (clobbered). A transposed reduction: pairwise shuffles and maxima reduce all the vectors at
// once, about 3 operations per vector on AVX-512, where a horizontal maximum of each would take
// about 9 plus the extraction of its scalar.
#if HWY_TARGET == HWY_SCALAR
template <class DU, class VU>
HWY_INLINE VU MaxOfEach(DU, VU* HWY_RESTRICT v) {
  return v[0];  // one lane: v[0] is its own maximum
}
#else
template <class DU, class VU>
HWY_INLINE VU MaxOfEach(DU du, VU* HWY_RESTRICT v) {
  constexpr size_t N = hn::MaxLanes(du);
  static_assert(N == 4 || N == 8 || N == 16, "a fixed-width target of 128, 256 or 512 bits");
  const hn::Repartition<uint64_t, DU> d64;
  // Pairs: each 128-bit block holds [v0 v1 v0 v1], partial maxima of v0 and v1.
  for (size_t i = 0; i < N / 2; ++i)
    v[i] = hn::Max(hn::InterleaveLower(du, v[2 * i], v[2 * i + 1]), hn::InterleaveUpper(du, v[2 * i], v[2 * i + 1]));
  // Quads: each block holds [v0 v1 v2 v3], each lane the maximum over that block of its vector.
  for (size_t i = 0; i < N / 4; ++i) {
    const auto a = hn::BitCast(d64, v[2 * i]), b = hn::BitCast(d64, v[2 * i + 1]);
    v[i] = hn::Max(hn::BitCast(du, hn::InterleaveLower(d64, a, b)), hn::BitCast(du, hn::InterleaveUpper(d64, a, b)));
  }
  // Then across blocks: v[i] holds vectors 4i..4i+3, once per 128-bit block.
  if constexpr (N == 4) {
    return v[0];
  } else if constexpr (N == 8) {
    return hn::Max(hn::ConcatLowerLower(du, v[1], v[0]), hn::ConcatUpperUpper(du, v[1], v[0]));
  } else {
    // Blocks [v0 v0 v2 v2] and [v1 v1 v3 v3], then the even blocks of one and the odd of the other.
    auto even = hn::Max(hn::ConcatLowerLower(du, v[2], v[0]), hn::ConcatUpperUpper(du, v[2], v[0]));
    auto odd = hn::Max(hn::ConcatLowerLower(du, v[3], v[1]), hn::ConcatUpperUpper(du, v[3], v[1]));
    even = hn::Max(even, hn::SwapAdjacentBlocks(even));
    odd = hn::Max(odd, hn::SwapAdjacentBlocks(odd));
    return hn::OddEvenBlocks(odd, even);
  }
}
#endif

// Blocks are quantized kGroup at a time: every block's maximum first, then the group's scales
// d and inverse scales as vectors, then the quants. Two scalar divisions per block would sit
// on each block's critical path and cost more than its quantization.
inline constexpr int64_t kGroup = 16;

#if HWY_HAVE_SCALABLE
// Vector length unknown at compile time: one horizontal reduction per block.
template <quant::Format F, typename T>
HWY_INLINE void GroupMaxBits(const T* const* HWY_RESTRICT blocks, uint32_t* HWY_RESTRICT bits) {
  for (int64_t b = 0; b < kGroup; ++b) {
    const uint32_t amax = AbsMaxBits(blocks[b]);
    bits[b] = F == quant::Format::q8_0 ? amax : float_to_bits(SignedMaxQ4_0(blocks[b], amax));
  }
}
#else
// bits[b]: the float bits of block b's maximum as ggml takes it, |x| for Q8_0, the signed value
// of largest magnitude for Q4_0 (SignedMaxQ4_0), for the kGroup blocks of blocks[].
//
// Q4_0 without searching each block: with r = x's bits rotated left by one (magnitude bits on
// top, the sign bit last), max r is the largest magnitude with its low bit set iff a negative
// value has it, and max (r ^ 1) the same with its low bit set iff a positive one does. Only when
// both do (+a and -a in one block, or all zeros) does the first of them decide, and only those
// blocks are searched. A NaN's magnitude bits are the largest, as in AbsMaxBits.
template <quant::Format F, typename T>
HWY_INLINE void GroupMaxBits(const T* const* HWY_RESTRICT blocks, uint32_t* HWY_RESTRICT bits) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  using VU = hn::Vec<decltype(du)>;
  constexpr size_t N = hn::MaxLanes(du);
  constexpr int64_t kVectors = quant::kBlock / static_cast<int64_t>(N);
  const auto one = hn::Set(du, 1u);
  for (int64_t g = 0; g < kGroup; g += static_cast<int64_t>(N)) {
    VU first[N], second[N];  // Q8_0: magnitudes; Q4_0: r and r ^ 1
    for (size_t b = 0; b < N; ++b) {
      const T* x = blocks[g + static_cast<int64_t>(b)];
      VU m1 = hn::Zero(du), m2 = hn::Zero(du);
      for (int64_t i = 0; i < kVectors; ++i) {
        const VU raw = hn::BitCast(du, LoadAs(df, x + i * static_cast<int64_t>(N)));
        if constexpr (F == quant::Format::q8_0) {
          m1 = hn::Max(m1, hn::And(raw, hn::Set(du, 0x7fffffffu)));
        } else {
          const VU r = hn::RotateRight<31>(raw);
          m1 = hn::Max(m1, r);
          m2 = hn::Max(m2, hn::Xor(r, one));
        }
      }
      first[b] = m1;
      second[b] = m2;
    }
    if constexpr (F == quant::Format::q8_0) {
      hn::StoreU(MaxOfEach(du, first), du, bits + g);
    } else {
      const VU r = MaxOfEach(du, first), r1 = MaxOfEach(du, second);
      const VU amax = hn::ShiftRight<1>(r);
      const auto negative = hn::TestBit(r, one), positive = hn::TestBit(r1, one);
      const auto nonzero = hn::Ne(amax, hn::Zero(du));
      const auto sign = hn::AndNot(positive, hn::And(negative, nonzero));
      hn::StoreU(hn::Or(amax, hn::IfThenElseZero(sign, hn::Set(du, 0x80000000u))), du, bits + g);
      const auto tie = hn::And(hn::And(negative, positive), nonzero);
      if (HWY_UNLIKELY(!hn::AllFalse(du, tie))) {
        HWY_ALIGN uint32_t a[N], tied[N];
        hn::Store(amax, du, a);
        hn::Store(hn::VecFromMask(du, tie), du, tied);
        for (size_t b = 0; b < N; ++b)
          if (tied[b]) bits[g + b] = float_to_bits(SignedMaxQ4_0(blocks[g + b], a[b]));
      }
    }
  }
}
#endif

// d[i] = max[i] / divisor and id[i] = d[i] != 0 ? 1 / d[i] : 0 for i < kGroup, max given by its
// float bits: the same correctly rounded divisions as quant::scale_q8_0 and quant::inverse_scale,
// lane by lane.
HWY_INLINE void GroupScales(const uint32_t* HWY_RESTRICT max_bits, float divisor, float* HWY_RESTRICT d,
                            float* HWY_RESTRICT id) {
  const hn::CappedTag<float, kGroup> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  for (int64_t i = 0; i < kGroup; i += static_cast<int64_t>(hn::Lanes(df))) {
    const auto dv = hn::Div(hn::BitCast(df, hn::LoadU(du, max_bits + i)), hn::Set(df, divisor));
    hn::StoreU(dv, df, d + i);
    hn::StoreU(hn::IfThenZeroElse(hn::Eq(dv, hn::Zero(df)), hn::Div(hn::Set(df, 1.0f), dv)), df, id + i);
  }
}

// The first `count` (<= kGroup) of blocks[] quantized into count consecutive blocks at o; the
// rest of blocks[] is overwritten (zeros, so the group's vectors stay defined).
template <quant::Format F, typename T>
HWY_INLINE void QuantizeGroup(const T* (&blocks)[kGroup], int64_t count, uint8_t* HWY_RESTRICT o) {
  static constexpr T zeros[quant::kBlock] = {};
  HWY_ALIGN uint32_t max_bits[kGroup];
  HWY_ALIGN float d[kGroup], id[kGroup];
  for (int64_t b = count; b < kGroup; ++b) blocks[b] = zeros;
  GroupMaxBits<F>(blocks, max_bits);
  GroupScales(max_bits, F == quant::Format::q8_0 ? 127.0f : -8.0f, d, id);
  const int64_t bytes = quant::block_bytes(F);
  for (int64_t b = 0; b < count; ++b, o += bytes) {
    if constexpr (F == quant::Format::q8_0) QuantsQ8_0(blocks[b], id[b], reinterpret_cast<int8_t*>(o + 2));
    else QuantsQ4_0(blocks[b], id[b], o + 2);
    quant::store_scale(o, to_float16(d[b]));
  }
}

// x: [..., k] (any strides, k % 32 == 0) -> out: [..., k / 32 * block_bytes], contiguous, in
// ggml's byte layout. Rows of stride 1: parallel over all blocks of all rows, so one long row
// splits too. Other rows go whole through RowSource (rows-inl.h), which reads rows that sit side
// by side (x.T) a panel at a time: block by block each block gathered 32 elements a row apart
// (4096 x 4096 float32 x.T: 24x the contiguous time).
template <quant::Format F, typename T>
void QuantizeRows(const TensorView& x, const TensorView& out) {
  const int64_t k = x.size(-1), nb = k / quant::kBlock, bytes = quant::block_bytes(F);
  if (nb == 0) return;
  uint8_t* dst = out.data_as<uint8_t>();
  if (x.stride(-1) != 1) {
    const int64_t rows = x.numel() / k;
    const int64_t grain = std::max({int64_t{1}, 512 / nb, RowSource<T>(x, k).panel_rows()});
    parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
      RowSource<T> xs(x, k);
      const T* blocks[kGroup];
      for (int64_t r = r0; r < r1; ++r) {
        const T* row = xs.row(r, r1);
        for (int64_t b0 = 0; b0 < nb; b0 += kGroup) {
          const int64_t count = std::min(kGroup, nb - b0);
          for (int64_t b = 0; b < count; ++b) blocks[b] = row + (b0 + b) * quant::kBlock;
          QuantizeGroup<F>(blocks, count, dst + (r * nb + b0) * bytes);
        }
      }
    });
    return;
  }
  parallel_for(x.numel() / quant::kBlock, 512, [&](int64_t begin, int64_t end) {
    const T* blocks[kGroup];
    quant::BlockCursor<T> cursor(x, quant::kBlock, begin);
    for (int64_t g0 = begin; g0 < end; g0 += kGroup) {
      const int64_t count = std::min(kGroup, end - g0);
      for (int64_t b = 0; b < count; ++b, cursor.next()) blocks[b] = cursor.get();
      QuantizeGroup<F>(blocks, count, dst + g0 * bytes);
    }
  });
}

}  // namespace opforge::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_CPU_GGML_QUANT_INL_H_
