// linear_act's matrix product entry point, Matmul: the packed-panel Gemm of gemm-inl.h, or dot
// products where one side has only a few rows (a matrix-vector product, in effect): packing would
// cost as much as the product there. Rows of both operands are then read as they are, a few dot
// products at a time along p, so each row of the big operand is read from memory once. bfloat16
// products on CPUs with AMX go to its tiles instead of Gemm (amx_bf16.h). Every path hands tiles
// to the same Epilogue. Re-included once per Highway target.
#if defined(OPFORGE_OPS_LINEAR_ACT_MATMUL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_OPS_LINEAR_ACT_MATMUL_INL_H_
#undef OPFORGE_OPS_LINEAR_ACT_MATMUL_INL_H_
#else
#define OPFORGE_OPS_LINEAR_ACT_MATMUL_INL_H_
#endif

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "opforge/parallel.h"
#include "opforge/simd.h"
#include "ops/linear_act/amx_bf16.h"
#include "ops/linear_act/gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::gemm::HWY_NAMESPACE {

// out[i][j] = sum_p x[i][p] * y[j][p] over K contiguous elements, MA x NB at a time; `ahead` the
// next tile's rows of y. GCC 12 keeps acc in memory (the loops after the hot one index it) and
// stores every accumulator on every step. Fully unrolled, with none of those stores, the tiles
// ran up to 20% faster from L3 but slower from DRAM (Zen 5 VM, 16384 x 4096 weight, alternating
// builds: bfloat16 4 rows 2.1-2.5 -> 2.7-3.3 ms, 8 rows 3.1 -> 4.5; float32 4 rows 4.7-6.1 ->
// 5.8-7.3), where these products spend their time: left as it is (2026-11-28).
template <int MA, int NB, class D, typename TX, typename TY, typename C = hn::TFromD<D>>
HWY_INLINE void DotTile(D d, const TX* const* x, const TY* const* y, int64_t K, C* out, int64_t ldo,
                        Ahead ahead = {}) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  hn::Vec<D> acc[MA][NB];
  for (int i = 0; i < MA; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = hn::Zero(d);
  const int64_t per_step = ahead.PerStep(K / L);
  const char* const ahead_end = ahead.at + ahead.lines * 64;
  int64_t p = 0;
  for (; p + L <= K; p += L) {
    ahead.Issue(per_step, ahead_end);
    hn::Vec<D> xv[MA];
    for (int i = 0; i < MA; ++i) xv[i] = LoadAs(d, x[i] + p);
    for (int j = 0; j < NB; ++j) {
      const auto yv = LoadAs(d, y[j] + p);
      for (int i = 0; i < MA; ++i) acc[i][j] = hn::MulAdd(xv[i], yv, acc[i][j]);
    }
  }
  for (int i = 0; i < MA; ++i) {
    for (int j = 0; j < NB; ++j) {
      C sum = hn::GetLane(hn::SumOfLanes(d, acc[i][j]));
      for (int64_t t = p; t < K; ++t) sum += ToCompute(x[i][t]) * ToCompute(y[j][t]);
      out[i * ldo + j] = sum;
    }
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && (defined(__GNUC__) || defined(__clang__))  // kPairTile
// DotTile for bfloat16 rows on AVX512_BF16's pair products (DotPairs, pair_tile-inl.h): 32
// elements a step, no conversions, in float32 (products of pairs added as vdpbf16ps adds them).
template <int MA, int NB>
HWY_INLINE void DotPairsTile(const hwy::bfloat16_t* const* x, const hwy::bfloat16_t* const* y, int64_t K, float* out,
                             int64_t ldo, Ahead ahead) {
  __m512 acc[MA][NB];
  for (int i = 0; i < MA; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  const int64_t per_step = ahead.PerStep(K / 32);
  const char* const ahead_end = ahead.at + ahead.lines * 64;
  int64_t p = 0;
  for (; p + 32 <= K; p += 32) {
    ahead.Issue(per_step, ahead_end);
    __m512i xv[MA];
    for (int i = 0; i < MA; ++i) xv[i] = _mm512_loadu_si512(x[i] + p);
    for (int j = 0; j < NB; ++j) {
      const __m512i yv = _mm512_loadu_si512(y[j] + p);
      for (int i = 0; i < MA; ++i) acc[i][j] = DotPairs(acc[i][j], xv[i], yv);
    }
  }
  for (int i = 0; i < MA; ++i) {
    for (int j = 0; j < NB; ++j) {
      float sum = _mm512_reduce_add_ps(acc[i][j]);
      for (int64_t t = p; t < K; ++t) sum += hwy::F32FromBF16(x[i][t]) * hwy::F32FromBF16(y[j][t]);
      out[i * ldo + j] = sum;
    }
  }
}
#endif

// Tile of D for rows x (MA of them) and y (NB): the pair products where they are on, else FMA.
template <int MA, int NB, class D, typename TX, typename TY, typename C>
HWY_INLINE void AnyDotTile(D d, const TX* const* x, const TY* const* y, int64_t K, C* out, int64_t ldo, Ahead ahead,
                           bool pairs) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && (defined(__GNUC__) || defined(__clang__))  // kPairTile
  if constexpr (std::is_same_v<TX, hwy::bfloat16_t> && std::is_same_v<TY, hwy::bfloat16_t>) {
    if (pairs) return DotPairsTile<MA, NB>(x, y, K, out, ldo, ahead);
  }
#endif
  (void)pairs;
  DotTile<MA, NB>(d, x, y, K, out, ldo, ahead);
}

// D = X Y^T (or its transpose) for an X of few rows: blocks of Y's rows in parallel, each row of
// Y read once for all of X. x_is_a: X is the product's A. Both operands have ps == 1.
template <typename TX, typename TY>
void Dot(const Operand<TX>& X, const Operand<TY>& Y, int64_t K, bool x_is_a, const Epilogue<Compute<TX>>& epi) {
  using C = Compute<TX>;
  const hn::ScalableTag<C> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  constexpr int64_t kBlock = 64;  // rows of Y per task
  const int64_t nx = X.rows, nx_pad = (nx + L - 1) / L * L;
  const int64_t blocks = (Y.rows + kBlock - 1) / kBlock;
  // bfloat16 rows on AVX512_BF16's pair products from 3 rows of X: with 1 or 2 the tile's 8 or 4
  // sums, one vdpbf16ps chain each, wait on its latency (one row against 4096 x 4096: 0.39 ms on
  // pairs, 0.33 ms converted to float32 for FMAs; 4 rows 0.45 against 0.83).
  const bool pairs = bf16_dot_enabled() && nx >= 3;
  parallel_for(blocks, std::max<int64_t>(1, (1 << 18) / (kBlock * (K + 1) * nx)), [&](int64_t begin, int64_t end) {
    // [x][y] when X is A (rows of D are X's rows), else [y][x]; padded to whole vectors.
    auto sums = hwy::AllocateAligned<C>(nx_pad * kBlock);
    std::fill(sums.get(), sums.get() + nx_pad * kBlock, C(0));
    const int64_t ld = x_is_a ? kBlock : nx_pad;
    C tile[4 * 8];
    for (int64_t block = begin; block < end; ++block) {
      const int64_t y0 = block * kBlock, ny = std::min(kBlock, Y.rows - y0);
      const int64_t group = nx == 1 ? 8 : 4;
      for (int64_t yb = 0; yb < ny; yb += group) {
        const TY* yr[8];
        for (int64_t j = 0; j < 8; ++j) yr[j] = Y.data + (y0 + yb + std::min(j, ny - yb - 1)) * Y.rs;
        const int64_t nb = std::min<int64_t>(group, ny - yb);
        // The group's rows are read side by side, streams the hardware prefetchers follow poorly
        // from DRAM: the next group's rows, where they lie one after another, are prefetched in
        // memory order meanwhile (within this task's rows).
        Ahead ahead;
        const int64_t next = y0 + yb + group, next_rows = std::min(group, std::min(end * kBlock, Y.rows) - next);
        if (Y.rs == K && next_rows > 0)
          ahead = {reinterpret_cast<const char*>(Y.data + next * Y.rs),
                   (next_rows * K * static_cast<int64_t>(sizeof(TY)) + 63) / 64};
        for (int64_t xb = 0; xb < nx; xb += 4) {
          const TX* xr[4];
          const int64_t ma = std::min<int64_t>(4, nx - xb);
          for (int64_t i = 0; i < 4; ++i) xr[i] = X.data + (xb + std::min(i, ma - 1)) * X.rs;
          int64_t ldt = 4;
          if (xb > 0) ahead = {};  // the first pass over the group's rows prefetched the next
          switch (ma) {
            case 1:
              if (nx == 1) {
                AnyDotTile<1, 8>(d, xr, yr, K, tile, 8, ahead, pairs);
                ldt = 8;
              } else {
                AnyDotTile<1, 4>(d, xr, yr, K, tile, 4, ahead, pairs);
              }
              break;
            case 2: AnyDotTile<2, 4>(d, xr, yr, K, tile, 4, ahead, pairs); break;
            case 3: AnyDotTile<3, 4>(d, xr, yr, K, tile, 4, ahead, pairs); break;
            default: AnyDotTile<4, 4>(d, xr, yr, K, tile, 4, ahead, pairs); break;
          }
          for (int64_t i = 0; i < ma; ++i)
            for (int64_t j = 0; j < nb; ++j)
              sums[x_is_a ? (xb + i) * ld + yb + j : (yb + j) * ld + xb + i] = tile[i * ldt + j];
        }
      }
      if (x_is_a)
        for (int64_t i = 0; i < nx; ++i) epi.Row(i, y0, sums.get() + i * ld, ny);
      else
        for (int64_t j = 0; j < ny; ++j) epi.Row(y0 + j, 0, sums.get() + j * ld, nx);
    }
  });
}

// Whether a product D = A B^T packs A rather than B. Packing costs rows * K element moves, and
// a packed A also hands its tiles over turned around (A.rows * B.rows moves more: Epilogue::Cols
// element by element, or AMX's blocks transposed): so only where A is much smaller than B (a few
// rows of x against a big weight).
inline bool PacksA(int64_t a_rows, int64_t b_rows, int64_t k) { return a_rows * (k + b_rows) < b_rows * k; }

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// Hands AMX's blocks of sums to an Epilogue, row by row of D: the packed operand P's rows where
// P is the product's A (the blocks then arrive turned around), else the other's.
class AmxBlocks final : public linear_act::amx::BlockSink {
 public:
  AmxBlocks(const Epilogue<float>& epi, bool p_is_a) : epi_(epi), p_is_a_(p_is_a) {}

  void operator()(int64_t q0, int64_t p0, float* c, int64_t ld, int64_t nq, int64_t np) const override {
    if (p_is_a_)
      for (int64_t j = 0; j < np; ++j) epi_.Row(p0 + j, q0, c + j * ld, nq);
    else
      for (int64_t i = 0; i < nq; ++i) epi_.Row(q0 + i, p0, c + i * ld, np);
  }

 private:
  const Epilogue<float>& epi_;
  bool p_is_a_;
};

// D = A B^T on AMX tiles (the unpacked operand's copies cost the same whichever is packed).
inline void AmxGemm(const Operand<hwy::bfloat16_t>& A, const Operand<hwy::bfloat16_t>& B, int64_t K,
                    const Epilogue<float>& epi) {
  const auto bits = [](const Operand<hwy::bfloat16_t>& o) {
    return linear_act::amx::Bf16Operand{reinterpret_cast<const uint16_t*>(o.data), o.rows, o.rs, o.ps};
  };
  const bool p_is_a = PacksA(A.rows, B.rows, K);
  linear_act::amx::gemm(bits(p_is_a ? A : B), bits(p_is_a ? B : A), K, p_is_a, AmxBlocks(epi, p_is_a));
}
#endif

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && (defined(__GNUC__) || defined(__clang__))  // kPairTile
// Whether a bfloat16 operand's rows read as pairs (Gemm's Operand<uint32_t>) where they are:
// contiguous, each row starting 4-byte aligned.
inline bool TakesPairs(const Operand<hwy::bfloat16_t>& o) {
  return o.ps == 1 && (o.rs % 2 == 0 || o.rows == 1) && reinterpret_cast<uintptr_t>(o.data) % 4 == 0;
}

// Whether its rows sit side by side (a transposed operand), which PairRows copies into pairs.
inline bool SideBySide(const Operand<hwy::bfloat16_t>& o) { return o.rs == 1 && o.ps != 1; }

// D = A B^T over bfloat16 pairs (AVX512_BF16's dot products; opforge/simd.h, bf16_dot_enabled),
// K even, each operand TakesPairs or SideBySide (made into pair rows once: 2 bytes an element
// moved, against 2 K flops per element of the product).
inline void PairGemm(const Operand<hwy::bfloat16_t>& A, const Operand<hwy::bfloat16_t>& B, int64_t K,
                     const Epilogue<float>& epi) {
  std::optional<cpu::BackendBuffer<uint32_t>> a_rows, b_rows;  // copies, for operands that need one
  const auto pairs = [&](const Operand<hwy::bfloat16_t>& o, std::optional<cpu::BackendBuffer<uint32_t>>& copy) {
    if (TakesPairs(o)) return Operand<uint32_t>{reinterpret_cast<const uint32_t*>(o.data), o.rows, o.rs / 2, 1};
    copy.emplace(std::max<int64_t>(1, o.rows * K / 2));
    PairRows(reinterpret_cast<const uint16_t*>(o.data), o.rows, o.ps, K, copy->get());
    return Operand<uint32_t>{copy->get(), o.rows, K / 2, 1};
  };
  const Operand<uint32_t> a = pairs(A, a_rows), b = pairs(B, b_rows);
  if (PacksA(A.rows, B.rows, K)) Gemm(a, b, K / 2, true, epi);
  else Gemm(b, a, K / 2, false, epi);
}
#endif

// D[a, b] = sum_p A(a, p) B(b, p) for a < A.rows, b < B.rows, every tile through `epi`.
template <typename TA, typename TB>
void Matmul(const Operand<TA>& A, const Operand<TB>& B, int64_t K, const Epilogue<Compute<TA>>& epi) {
  static_assert(std::is_same_v<Compute<TA>, Compute<TB>>);
  if (A.rows == 0 || B.rows == 0) return;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<Compute<TA>>()));
  // A panel of 2 vectors' rows costs the same for 1 row as for all of them: below about 3/16 of
  // that, dot products are faster (measured: 1-16 rows against 4096 x 4096 with AVX-512). On
  // AVX512_BF16's pairs, up to 12 rows (1-24 rows against 4096 x 4096 and 16384 x 4096, Zen 5 VM:
  // 8 rows 0.96-1.08 -> 0.70-0.74 ms and 4.6-5.0 -> 2.9-3.0 ms against one-vector panels); not
  // where AMX takes the products (untimed against its tiles).
  int64_t dot_max = std::max<int64_t>(2, lanes * 3 / 8);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && (defined(__GNUC__) || defined(__clang__))  // kPairTile
  if constexpr (std::is_same_v<TA, hwy::bfloat16_t> && std::is_same_v<TB, hwy::bfloat16_t>)
    if (bf16_dot_enabled() && !amx_enabled()) dot_max = 12;
#endif
  if (A.ps == 1 && B.ps == 1 && K > 0 && std::min(A.rows, B.rows) <= dot_max) {
    if (A.rows <= B.rows) Dot(A, B, K, true, epi);
    else Dot(B, A, K, false, epi);
    return;
  }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (std::is_same_v<TA, hwy::bfloat16_t> && std::is_same_v<TB, hwy::bfloat16_t>) {
    if (K > 0 && amx_enabled()) return AmxGemm(A, B, K, epi);
#if defined(__GNUC__) || defined(__clang__)  // kPairTile
    const auto readable = [](const Operand<hwy::bfloat16_t>& o) { return TakesPairs(o) || SideBySide(o); };
    if (K % 2 == 0 && bf16_dot_enabled() && readable(A) && readable(B)) return PairGemm(A, B, K, epi);
#endif
  }
#endif
  if (PacksA(A.rows, B.rows, K)) {
    Gemm(A, B, K, true, epi);
  } else {
    Gemm(B, A, K, false, epi);
  }
}

}  // namespace opforge::gemm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_OPS_LINEAR_ACT_MATMUL_INL_H_
