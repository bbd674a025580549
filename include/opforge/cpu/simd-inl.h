// Per-target SIMD helpers shared by CPU kernels: load any float dtype as float lanes (double
// lanes for float64), store back with round-to-nearest-even, and row loops for unary and
// binary elementwise ops (binary-inl.h walks whole tensors with them). Re-included once per
// Highway target, like the kernels using it.
#if defined(OPFORGE_CPU_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_CPU_SIMD_INL_H_
#undef OPFORGE_CPU_SIMD_INL_H_
#else
#define OPFORGE_CPU_SIMD_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "opforge/cpu/strided.h"
#include "opforge/cpu/visit.h"
#include "opforge/half.h"
#include "opforge/simd.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The type arithmetic happens in: float for the half types, the type itself otherwise.
template <typename T>
using Compute = std::conditional_t<std::is_same_v<T, hwy::float16_t> || std::is_same_v<T, hwy::bfloat16_t>, float, T>;

// Through the bits with std::bit_cast: Highway's half types are structs on x86 but the native
// __fp16 on Arm, which has no .bits.
template <typename T>
HWY_INLINE Compute<T> ToCompute(T v) {
  if constexpr (std::is_same_v<T, hwy::float16_t>) return to_float(float16{std::bit_cast<uint16_t>(v)});
  else if constexpr (std::is_same_v<T, hwy::bfloat16_t>) return to_float(bfloat16{std::bit_cast<uint16_t>(v)});
  else return v;
}

template <typename T>
HWY_INLINE T FromCompute(Compute<T> v) {
  if constexpr (std::is_same_v<T, hwy::float16_t>) return std::bit_cast<T>(to_float16(v).bits);
  else if constexpr (std::is_same_v<T, hwy::bfloat16_t>) return std::bit_cast<T>(to_bfloat16(v).bits);
  else return v;
}

// a * b + c for one element, rounded as hn::MulAdd rounds it on this target: fused where the
// target's vectors fuse it (HWY_NATIVE_FMA), the product rounded first elsewhere (SSE4, SCALAR,
// EMU128). opforge compiles with -ffp-contract=off (cmake/simd.cmake), so a scalar tail computes
// what its source says and matches its vector loop only through this; GCC's contraction used to
// decide it, differently in two instantiations of one kernel.
template <typename C>
HWY_INLINE C ScalarMulAdd(C a, C b, C c) {
#if HWY_NATIVE_FMA
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// Highway 1.0.3 emulates f16 <-> f32 on targets without hardware conversion (SSE4, SCALAR,
// EMU128): it truncates instead of rounding and turns inf and NaN into finite numbers. Those
// targets convert lane by lane through half.h instead.
#if (HWY_ARCH_X86 && HWY_TARGET < HWY_SSE4 && !defined(HWY_DISABLE_F16C)) || \
    (HWY_ARCH_ARM_A64 && HWY_TARGET == HWY_NEON)
inline constexpr bool kExactF16 = true;
#else
inline constexpr bool kExactF16 = false;
#endif

// D is a tag over Compute<T>.
template <typename T, class D>
HWY_INLINE hn::Vec<D> LoadAs(D d, const T* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<T, Compute<T>>) {
    return hn::LoadU(d, p);
  } else if constexpr (std::is_same_v<T, hwy::float16_t> && !kExactF16) {
    float lanes[HWY_MAX_BYTES / sizeof(float)];
    for (size_t i = 0; i < hn::Lanes(d); ++i) lanes[i] = ToCompute(p[i]);
    return hn::LoadU(d, lanes);
  } else {
    return hn::PromoteTo(d, hn::LoadU(hn::Rebind<T, D>(), p));
  }
}

// The AVX-512 targets' bfloat16 store by the CPU's own conversion (opforge/simd.h,
// bf16_convert_enabled): v's lanes rounded to nearest even, NaNs quieted, stored at p; or false,
// and nothing stored, where the CPU lacks the instruction (or it is turned off), v is not a whole
// 512-bit vector (narrower ones are rare on these targets and keep the software rounding), or a
// lane is subnormal (the instruction flushes those to zero; the software rounding keeps them).
// Highway 1.0.3 has no target with AVX512_BF16, so the kernels are not compiled with that
// extension and cannot name its intrinsic: the instruction is written as assembly.
template <class D>
HWY_INLINE bool StoreBf16ByCpu(D, hn::Vec<D> v, hwy::bfloat16_t* HWY_RESTRICT p) {
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL) && \
    (defined(__GNUC__) || defined(__clang__))
  if constexpr (hn::MaxLanes(D()) * sizeof(float) == 64) {
    if (!detail::bf16_convert_on || _mm512_fpclass_ps_mask(v.raw, 0x20)) return false;  // 0x20: subnormal
    __m256i out;
    asm("vcvtneps2bf16 %1, %0" : "=v"(out) : "v"(v.raw));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), out);
    return true;
  }
#endif
  (void)v;
  (void)p;
  return false;
}

template <typename T, class D>
HWY_INLINE void StoreAs(D d, hn::Vec<D> v, T* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<T, Compute<T>>) {
    hn::StoreU(v, d, p);
  } else if constexpr (std::is_same_v<T, hwy::float16_t> && !kExactF16) {
    float lanes[HWY_MAX_BYTES / sizeof(float)];
    hn::StoreU(v, d, lanes);
    for (size_t i = 0; i < hn::Lanes(d); ++i) p[i] = FromCompute<T>(lanes[i]);
  } else if constexpr (std::is_same_v<T, hwy::float16_t>) {
    hn::StoreU(hn::DemoteTo(hn::Rebind<T, D>(), v), hn::Rebind<T, D>(), p);
  } else {
    if (StoreBf16ByCpu(d, v, p)) return;
    // Highway 1.0.3's bf16 DemoteTo truncates; round to nearest even like torch and JAX.
    const hn::RebindToUnsigned<D> du;
    const hn::RebindToSigned<D> di;
    const auto bits = hn::BitCast(du, v);
    const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
    const auto rounded = hn::Add(bits, hn::Add(lsb, hn::Set(du, 0x7fffu)));
    const auto quiet_nan = hn::Or(bits, hn::Set(du, 0x00400000u));
    const auto chosen = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet_nan, rounded);
    const hn::Rebind<uint16_t, D> du16;
    const auto halves = hn::DemoteTo(du16, hn::BitCast(di, hn::ShiftRight<16>(chosen)));
    hn::StoreU(hn::BitCast(hn::Rebind<T, D>(), halves), hn::Rebind<T, D>(), p);
  }
}

// How many rows ahead a walk should prefetch an operand whose rows start `outer` elements
// apart but span fewer, skipping whole cache lines between them (x[:, :16] of a 32-wide x reads
// every other 64-byte line): the hardware prefetcher follows dense streams and left such walks
// waiting on memory (relu of that slice, 262144 rows, one thread: 7.9 ns a row, torch 5.1; 2.8
// prefetching 8 KiB ahead). 0 where the rows leave no line out.
template <typename T>
HWY_INLINE int64_t RowsAhead(int64_t outer, int64_t inner, int64_t len) {
  const int64_t pitch = (outer < 0 ? -outer : outer) * static_cast<int64_t>(sizeof(T));
  const int64_t span = ((len - 1) * (inner < 0 ? -inner : inner) + 1) * static_cast<int64_t>(sizeof(T));
  if (pitch - span < 64) return 0;
  return std::max<int64_t>(1, (8 << 10) / pitch);
}

// Prefetches row c + ahead of an operand whose rows start `outer` elements apart from p (row 0).
template <typename T>
HWY_INLINE void PrefetchRow(const T* p, int64_t outer, int64_t c, int64_t ahead) {
  if (ahead) hwy::Prefetch(p + (c + ahead) * outer);
}

// piece(c, 0, len) for each row c of block r (operand 0 the output, 1.. the inputs at in[]),
// prefetching ahead the inputs whose rows skip cache lines (RowsAhead).
template <typename T, size_t N, class Piece>
HWY_INLINE void EachRowPrefetching(const std::array<const T*, N - 1>& in, const Rows<N>& r, const Piece& piece) {
  std::array<int64_t, N - 1> ahead{};
  if (r.count > 1)
    for (size_t k = 0; k + 1 < N; ++k) ahead[k] = RowsAhead<T>(r.outer[k + 1], r.inner[k + 1], r.len);
  for (int64_t c = 0; c < r.count; ++c) {
    for (size_t k = 0; k + 1 < N; ++k) PrefetchRow(in[k] + r.offsets[k + 1], r.outer[k + 1], c, ahead[k]);
    piece(c, 0, r.len);
  }
}

// op over a block of rows (for_each_row's Rows, operand 0 the output, 1.. the N - 1 <= 2 inputs,
// every operand stepping by 1) whose rows are half a vector long (x[:, :8] of float32 on AVX-512):
// two rows to a vector, each half one load of its own row; walked row by row, each row went
// through a lane buffer (relu of a 262144 x 48 tensor's [:, :8]: 3.8 ms one thread, torch 0.7-1.5).
// A last odd row by piece(c, 0, len). False, with nothing done, for any other block.
template <typename T, size_t N, class Op, class Piece>
HWY_INLINE bool MapRowPairs(T* HWY_RESTRICT out, const std::array<const T*, N - 1>& in, const Rows<N>& r,
                            const Op& op, const Piece& piece) {
  static_assert(N == 2 || N == 3, "one or two inputs");
#if HWY_HAVE_SCALABLE || HWY_TARGET == HWY_SCALAR
  (void)out, (void)in, (void)r, (void)op, (void)piece;
  return false;
#else
  const hn::ScalableTag<Compute<T>> d;
  const hn::Half<decltype(d)> dh;
  if (r.count < 2 || 2 * r.len != static_cast<int64_t>(hn::Lanes(d))) return false;
  for (size_t k = 0; k < N; ++k)
    if (r.inner[k] != 1) return false;
  const auto pair = [&](size_t k, int64_t c) {
    const T* p = in[k - 1] + r.at(k, c);
    return hn::Combine(d, LoadAs(dh, p + r.outer[k]), LoadAs(dh, p));
  };
  const int64_t pairs = r.count / 2 * 2;
  for (int64_t c = 0; c < pairs; c += 2) {
    hn::Vec<decltype(d)> v;
    if constexpr (N == 2) v = op(d, pair(1, c));
    else v = op(d, pair(1, c), pair(2, c));
    T* o = out + r.at(0, c);
    if (r.outer[0] == r.len) {
      StoreAs(d, v, o);
    } else {
      StoreAs(dh, hn::LowerHalf(dh, v), o);
      StoreAs(dh, hn::UpperHalf(dh, v), o + r.outer[0]);
    }
  }
  if (pairs < r.count) piece(pairs, 0, r.len);
  return true;
#endif
}

// Vectors (tag D, over Compute<T>) of a row of T with stride s: lane j of the vector at element i
// is p[(i + j) * s]. Stride 2 (x[..., ::2], one of interleaved pairs) deinterleaves plain loads;
// strides 1 and 0 load and broadcast (the other operand of a binary op's strided row); others
// gather (not the half types, which take stride 2, 1 and 0 only). Copying lanes through a
// buffer stalled each vector load on its lane stores, and AMD's gathers take ~20 cycles a
// vector: [:, ::2] slices ran at 0.4-0.5 ns per element, 3-6x their contiguous time.
template <class D, typename T = hn::TFromD<D>>
class StridedRow {
  using DI = hn::RebindToSigned<D>;
  static constexpr bool kWide = std::is_same_v<T, hn::TFromD<D>>;  // no conversion on load
  // Half types deinterleave as 16-bit lanes, then widen (f16 where conversion is exact).
  static constexpr bool kPairs =
      HWY_TARGET != HWY_SCALAR && (kWide || std::is_same_v<T, hwy::bfloat16_t> || kExactF16);

 public:
  // Whether rows of stride s can be read so: gather offsets within the index lanes' range.
  static bool Takes(D d, int64_t s) {
    if (s == 1 || s == 0) return true;
    if (s == 2 && kPairs) return true;
    const int64_t most = static_cast<int64_t>(hn::Lanes(d)) * (s < 0 ? -s : s);
    return kWide && most < static_cast<int64_t>(std::numeric_limits<hn::TFromD<DI>>::max() / 2);
  }
  StridedRow(D d, const T* p, int64_t s) : d_(d), p_(p), s_(s) {
    HWY_ALIGN hn::TFromD<DI> at[HWY_MAX_BYTES / sizeof(hn::TFromD<DI>)];
    for (size_t j = 0; j < hn::Lanes(d); ++j) at[j] = static_cast<hn::TFromD<DI>>(static_cast<int64_t>(j) * s);
    at_ = hn::Load(DI(), at);
  }
  // Whether the vector at element i of an n-element row loads so: stride 2's loads end one
  // element past the vector's last, so not for the row's last vector.
  bool Has(int64_t i, int64_t n) const {
    return i + static_cast<int64_t>(hn::Lanes(d_)) + (s_ == 2 ? 1 : 0) <= n;
  }
  hn::Vec<D> Load(int64_t i) const {
    const T* p = p_ + i * s_;
    if (s_ == 1) return LoadAs(d_, p);
    if (s_ == 0) return hn::Set(d_, ToCompute(*p));
#if HWY_TARGET != HWY_SCALAR  // one lane: no ConcatEven, and kPairs is false
    if constexpr (kPairs) {
      if (s_ == 2) {
        if constexpr (kWide) {
          return hn::ConcatEven(d_, hn::LoadU(d_, p + hn::Lanes(d_)), hn::LoadU(d_, p));
        } else {
          // Deinterleaved as uint16 lanes: Highway's Arm target has no ConcatEven or
          // LowerHalf for half-type vectors.
          const hn::Rebind<T, D> dh;
          const hn::RebindToUnsigned<decltype(dh)> duh;
          const hn::Twice<decltype(duh)> duw;
          const auto both = hn::LoadU(duw, reinterpret_cast<const uint16_t*>(p));
          return hn::PromoteTo(d_, hn::BitCast(dh, hn::LowerHalf(duh, hn::ConcatEven(duw, both, both))));
        }
      }
    }
#endif
    if constexpr (kWide) return hn::GatherIndex(d_, p, at_);
    return hn::Zero(d_);  // unreachable: Takes() refused the stride
  }

 private:
  D d_;
  const T* p_;
  int64_t s_;
  hn::Vec<DI> at_;
};

// out[i] = op(a[i * sa]) for i < n; out is contiguous. op has SIMD and scalar overloads:
// op(d, v) and op(c) on Compute<T>.
template <typename T, class Op>
HWY_INLINE void UnaryRow(T* HWY_RESTRICT out, const T* HWY_RESTRICT a, int64_t sa, int64_t n, const Op& op) {
  const hn::ScalableTag<Compute<T>> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  if (sa == 1) {
    for (; i + lanes <= n; i += lanes) StoreAs(d, op(d, LoadAs(d, a + i)), out + i);
  } else if (StridedRow<decltype(d), T>::Takes(d, sa)) {
    const StridedRow<decltype(d), T> row(d, a, sa);
    for (; row.Has(i, n); i += lanes) StoreAs(d, op(d, row.Load(i)), out + i);
  }
  for (; i < n; ++i) out[i] = FromCompute<T>(op(ToCompute(a[i * sa])));
}

// out[i] = op(a[i * sa], b[i * sb]); every stride takes SIMD for float and double (StridedRow), strides
// of 1 and 0 (a broadcast scalar) for every type.
template <typename T, class Op>
HWY_INLINE void BinaryRow(T* HWY_RESTRICT out, const T* HWY_RESTRICT a, int64_t sa,
                          const T* HWY_RESTRICT b, int64_t sb, int64_t n, const Op& op) {
  const hn::ScalableTag<Compute<T>> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  if (sa == 1 && sb == 1) {
    for (; i + lanes <= n; i += lanes)
      StoreAs(d, op(d, LoadAs(d, a + i), LoadAs(d, b + i)), out + i);
  } else if (sa == 1 && sb == 0) {
    const auto vb = hn::Set(d, ToCompute(b[0]));
    for (; i + lanes <= n; i += lanes) StoreAs(d, op(d, LoadAs(d, a + i), vb), out + i);
  } else if (sa == 0 && sb == 1) {
    const auto va = hn::Set(d, ToCompute(a[0]));
    for (; i + lanes <= n; i += lanes) StoreAs(d, op(d, va, LoadAs(d, b + i)), out + i);
  } else {  // a strided row (a slice's)
    using Row = StridedRow<decltype(d), T>;
    if (Row::Takes(d, sa) && Row::Takes(d, sb)) {
      const Row ra(d, a, sa), rb(d, b, sb);
      for (; ra.Has(i, n) && rb.Has(i, n); i += lanes) StoreAs(d, op(d, ra.Load(i), rb.Load(i)), out + i);
    }
  }
  for (; i < n; ++i) out[i] = FromCompute<T>(op(ToCompute(a[i * sa]), ToCompute(b[i * sb])));
}

}  // namespace opforge::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_CPU_SIMD_INL_H_
