// The blocked matrix product behind linear_act and linear_act_backward (matmul-inl.h picks it or
// the dot-product path): D[a, b] = sum_p A(a, p) B(b, p) for strided operands (element (r, p) of
// an operand at data[r * rs + p * ps]), each finished tile handed to an Epilogue while it is still
// in L1 (bias, activation, rounding to the output dtype), so the result is written once and never
// swept again. Re-included once per Highway target.
//
// Gemm: lanes run along one operand, P, packed once into panels of 2 vectors' worth of rows
// ([panel][p][2 * lanes], zero-padded; one vector's where that holds all of P); the other, Q, is
// broadcast element by element straight from its rows (copied only where it needs converting or
// gathering). The micro-kernel keeps a
// 2-vector x kTileS tile of sums in registers (16 with AVX-512, 12 of AVX2's 16). Blocking:
// KC steps of p at a time keep a Q tile in L1 and a block of MC packed P rows in L2; partial sums
// live in a per-task scratch between K blocks; where P's block fits L2 (a few rows of x against a
// big weight), each Q tile goes through all of K before the next, whose rows are prefetched in
// memory order meanwhile (opforge/cpu/ahead.h). Matmul picks P: B unless A is much smaller (the
// packing, a transposing copy, costs O(P.rows * K) for 2 M N K flops; an A packed hands its
// tiles over turned around).
//
// Results do not depend on the thread count: every sum runs over p in the same order whichever
// task computes it.
#if defined(OPFORGE_OPS_LINEAR_ACT_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_OPS_LINEAR_ACT_GEMM_INL_H_
#undef OPFORGE_OPS_LINEAR_ACT_GEMM_INL_H_
#else
#define OPFORGE_OPS_LINEAR_ACT_GEMM_INL_H_
#endif

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "opforge/cpu/scratch.h"
#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/transpose-inl.h"
#include "opforge/parallel.h"
#include "ops/linear_act/pair_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::gemm::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using cpu::HWY_NAMESPACE::Compute;
using cpu::HWY_NAMESPACE::FromCompute;
using cpu::HWY_NAMESPACE::LoadAs;
using cpu::HWY_NAMESPACE::StoreAs;
using cpu::HWY_NAMESPACE::ToCompute;

// Element (r, p) at data[r * rs + p * ps], r < rows.
template <typename T>
struct Operand {
  const T* data;
  int64_t rows, rs, ps;
};

// Tile width: accumulators (2 * kTileS vectors) to hide FMA latency, within the vector registers,
// and one pointer per Q row within the 15 general-purpose ones. With AVX-512, 8 (16 accumulators)
// measured 11% faster than 12 on Zen 4: 12 row pointers spill.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
inline constexpr int kTileS = 8;
#else
inline constexpr int kTileS = 6;  // 12 accumulators + 3 of 16 registers
#endif

// What happens to finished sums. Row gets D[a, b0 + i] for i < count, contiguous in `vals`, which
// stays readable (not meaningful) up to a whole vector past count. Cols gets a tile transposed,
// D[a0 + i, b0 + j] = vals[j * ld + i] for i < na <= 2 * lanes and j < nb <= kTileS, and may
// overwrite it; by default it transposes the tile and hands on its rows.
template <typename C>
class Epilogue {
 public:
  virtual ~Epilogue() = default;
  virtual void Row(int64_t a, int64_t b0, const C* vals, int64_t count) const = 0;
  virtual void Cols(int64_t a0, int64_t b0, C* vals, int64_t ld, int64_t na, int64_t nb) const {
    constexpr int64_t kLanes = HWY_MAX_BYTES / sizeof(C), kLd = (kTileS + kLanes - 1) / kLanes * kLanes;
    HWY_ALIGN C rows[2 * kLanes * kLd];
    for (int64_t i = 0; i < na; ++i) {
      for (int64_t j = 0; j < nb; ++j) rows[i * kLd + j] = vals[j * ld + i];
      Row(a0 + i, b0, rows + i * kLd, nb);
    }
  }
};

// The first min(count, lanes) elements at p (stride `stride`) as Compute lanes, the rest zero.
template <class D, typename T>
HWY_INLINE hn::Vec<D> LoadN(D d, const T* p, int64_t stride, int64_t count) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  if (stride == 1 && count >= lanes) return LoadAs(d, p);
  HWY_ALIGN hn::TFromD<D> buf[HWY_MAX_BYTES / sizeof(hn::TFromD<D>)];
  for (int64_t i = 0; i < lanes; ++i) buf[i] = i < count ? ToCompute(p[i * stride]) : hn::TFromD<D>(0);
  return hn::Load(d, buf);
}

// Stores the first min(count, lanes) lanes of v to p (stride `stride`), rounded to T.
template <class D, typename T>
HWY_INLINE void StoreN(D d, hn::Vec<D> v, T* p, int64_t stride, int64_t count) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  if (stride == 1 && count >= lanes) return StoreAs(d, v, p);
  HWY_ALIGN hn::TFromD<D> buf[HWY_MAX_BYTES / sizeof(hn::TFromD<D>)];
  hn::Store(v, d, buf);
  for (int64_t i = 0; i < std::min(count, lanes); ++i) p[i * stride] = FromCompute<T>(buf[i]);
}

// c[j * ldc + i] (+)= sum_p panel[p][i] * q[j][p] for i < V * lanes, j < kTileS: panels of V
// vectors' rows (2, or 1 where P has no more rows than a vector has lanes: a few rows of x
// against a big weight, where a second vector would be all padding).
template <int V, bool kAhead, class D, typename C = hn::TFromD<D>>
HWY_NOINLINE void Tile(D d, const C* HWY_RESTRICT panel, const C* const* q_rows, int64_t kc, C* HWY_RESTRICT c,
                       int64_t ldc, bool accumulate, Ahead ahead) {
  constexpr int S = kTileS;
  const size_t L = hn::Lanes(d);
  hn::Vec<D> acc[V][S];
  const C* q[S];
  for (int j = 0; j < S; ++j) {
    q[j] = q_rows[j];
    for (int v = 0; v < V; ++v) acc[v][j] = accumulate ? hn::Load(d, c + j * ldc + v * L) : hn::Zero(d);
  }
  const int64_t per_step = ahead.PerStep(kc);
  const char* const ahead_end = ahead.at + ahead.lines * 64;
  for (int64_t p = 0; p < kc; ++p) {
    if constexpr (kAhead) ahead.Issue(per_step, ahead_end);
    hn::Vec<D> a[V];
    for (int v = 0; v < V; ++v) a[v] = hn::Load(d, panel + (p * V + v) * L);
#pragma GCC unroll 8
    for (int j = 0; j < S; ++j) {
      const auto b = hn::Set(d, q[j][p]);
      for (int v = 0; v < V; ++v) acc[v][j] = hn::MulAdd(a[v], b, acc[v][j]);
    }
  }
  for (int j = 0; j < S; ++j)
    for (int v = 0; v < V; ++v) hn::Store(acc[v][j], d, c + j * ldc + v * L);
}

// P's rows in panels of V * lanes, [panel][p][row in panel], as Compute values; rows past the
// end are zero. A row-major P (ps == 1) is transposed in blocks of kPackBlock steps of p, so
// the block being written stays in L1.
template <int V, typename TP, typename C>
void PackPanels(const Operand<TP>& P, int64_t K, C* packed) {
  const hn::ScalableTag<C> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d)), VL = V * L;
  const int64_t panels = (P.rows + VL - 1) / VL;
  constexpr int64_t kPackBlock = 64;
  parallel_for(panels, std::max<int64_t>(1, (1 << 15) / (VL * K + 1)), [&](int64_t begin, int64_t end) {
    HWY_ALIGN C block[HWY_MAX_BYTES / sizeof(C) * V * kPackBlock];
    for (int64_t panel = begin; panel < end; ++panel) {
      C* dst = packed + panel * K * VL;
      const int64_t r0 = panel * VL, valid = std::min(VL, P.rows - r0);
      if (P.ps == 1) {
        for (int64_t p0 = 0; p0 < K; p0 += kPackBlock) {
          const int64_t pn = std::min(kPackBlock, K - p0);
          for (int64_t i = 0; i < VL; ++i) {
            C* row = block + i * kPackBlock;
            if (i >= valid) {
              std::fill(row, row + pn, C(0));
              continue;
            }
            const TP* src = P.data + (r0 + i) * P.rs + p0;
            for (int64_t p = 0; p < pn; p += L) hn::Store(LoadN(d, src + p, 1, pn - p), d, row + p);
          }
          for (int64_t p = 0; p < pn; ++p)
            for (int64_t i = 0; i < VL; ++i) dst[(p0 + p) * VL + i] = block[i * kPackBlock + p];
        }
      } else {
        for (int64_t p = 0; p < K; ++p)
          for (int64_t i = 0; i < VL; i += L)
            hn::Store(LoadN(d, P.data + (r0 + i) * P.rs + p * P.ps, P.rs, valid - i), d, dst + p * VL + i);
      }
    }
  });
}

// Pointers to rows s..s+kTileS of Q over p0..p0+kc as contiguous Compute values: Q itself where
// it already is that, else a copy in `buf` (kTileS rows of stride kc_max). Rows past `valid`
// repeat row s (computed, never stored).
template <typename TQ, typename C>
void QRows(const Operand<TQ>& Q, int64_t s, int64_t valid, int64_t p0, int64_t kc, C* buf, int64_t kc_max,
           const C* rows[kTileS]) {
  if constexpr (std::is_same_v<TQ, C>) {
    if (Q.ps == 1) {
      for (int j = 0; j < kTileS; ++j) rows[j] = Q.data + (s + (j < valid ? j : 0)) * Q.rs + p0;
      return;
    }
  }
  if (Q.ps == 1) {
    const hn::ScalableTag<C> d;
    const int64_t L = static_cast<int64_t>(hn::Lanes(d));
    for (int64_t j = 0; j < valid; ++j)
      for (int64_t p = 0; p < kc; p += L)
        hn::StoreU(LoadN(d, Q.data + (s + j) * Q.rs + p0 + p, 1, kc - p), d, buf + j * kc_max + p);
  } else {
    for (int64_t p = 0; p < kc; ++p)  // p outer: a transposed Q has its rows side by side
      for (int64_t j = 0; j < valid; ++j) buf[j * kc_max + p] = ToCompute(Q.data[(s + j) * Q.rs + (p0 + p) * Q.ps]);
  }
  for (int j = 0; j < kTileS; ++j) rows[j] = buf + (j < valid ? j : 0) * kc_max;
}

// Q's rows side by side (Q.rs == 1: g^T in the weight gradient) as contiguous Compute rows
// out[r * K + p], once, in L x L register transposes; QRows gathered them element by element for
// every block of P rows (2048^3 float32 grad_weight: 49 -> 41 ms).
#if !HWY_HAVE_SCALABLE && HWY_TARGET != HWY_SCALAR  // LoadSquare's targets
template <typename TQ, typename C>
void TransposeRows(const Operand<TQ>& Q, int64_t K, C* HWY_RESTRICT out) {
  constexpr int64_t L = cpu::HWY_NAMESPACE::kSquareLanes<C>;
  static_assert(L > 0);
  const hn::ScalableTag<C> d;
  const int64_t groups = (Q.rows + L - 1) / L;
  parallel_for(groups, std::max<int64_t>(1, (1 << 14) / (L * K + 1)), [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t c0 = g * L, rows = std::min(L, Q.rows - c0);
      int64_t j0 = 0;
      for (; rows == L && j0 + L <= K; j0 += L) {
        hn::Vec<decltype(d)> v[L];
        cpu::HWY_NAMESPACE::LoadSquare(d, Q.data, 1, Q.ps, cpu::HWY_NAMESPACE::TileRead::kColumns, c0, j0, v);
        for (int64_t i = 0; i < L; ++i) hn::StoreU(v[i], d, out + (c0 + i) * K + j0);
      }
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t p = j0; p < K; ++p) out[(c0 + i) * K + p] = ToCompute(Q.data[c0 + i + p * Q.ps]);
    }
  });
}
#endif

template <int V, typename TP, typename TQ, typename Sum>
void GemmPanels(const Operand<TP>& P, const Operand<TQ>& Q, int64_t K, bool p_is_a, const Epilogue<Sum>& epi);

// D = P Q^T through the packed-panel micro-kernel. p_is_a: P is the product's A (the epilogue
// gets columns of D), else its B (rows of D). Operands of uint32_t are bfloat16 pairs (element p
// of such a row: the pair 2p, 2p + 1 of the bfloat16 row, 2p in the low half; K counts pairs),
// multiplied by PairTile (pair_tile-inl.h) into float32 sums (AVX-512 targets only). GemmPanels
// (below) does it with panels of V vectors' rows.
template <typename TP, typename TQ, typename Sum = Compute<TP>>
void Gemm(const Operand<TP>& P, const Operand<TQ>& Q, int64_t K, bool p_is_a, const Epilogue<Sum>& epi) {
  using C = Compute<TP>;
  constexpr bool kPairs = std::is_same_v<TP, uint32_t>;
  static_assert(!kPairs || (kPairTile && std::is_same_v<TQ, uint32_t> && std::is_same_v<Sum, float>));
#if !HWY_HAVE_SCALABLE && HWY_TARGET != HWY_SCALAR
  if constexpr (!kPairs && cpu::HWY_NAMESPACE::kSquareLanes<C> > 0) {
    if (Q.rs == 1 && Q.ps != 1 && Q.rows > 1 && K > 0) {  // rows side by side: contiguous once
      const cpu::BackendBuffer<C> rows(Q.rows * K);
      TransposeRows(Q, K, rows.get());
      return Gemm(P, Operand<C>{rows.get(), Q.rows, K, 1}, K, p_is_a, epi);
    }
  }
#endif
  // One vector's rows per panel where they hold all of P: 8-16 rows of x against a 16384 x 4096
  // float32 weight took 11.4 ms in two-vector panels, three quarters padding (Zen 5 VM).
  if (P.rows <= static_cast<int64_t>(hn::Lanes(hn::ScalableTag<C>()))) return GemmPanels<1>(P, Q, K, p_is_a, epi);
  GemmPanels<2>(P, Q, K, p_is_a, epi);
}

template <int V, typename TP, typename TQ, typename Sum>
void GemmPanels(const Operand<TP>& P, const Operand<TQ>& Q, int64_t K, bool p_is_a, const Epilogue<Sum>& epi) {
  using C = Compute<TP>;
  constexpr bool kPairs = std::is_same_v<TP, uint32_t>;
  constexpr int S = kTileS;
  const hn::ScalableTag<C> d;
  const int64_t VL = V * static_cast<int64_t>(hn::Lanes(d));
  const int64_t panels = (P.rows + VL - 1) / VL;
  const cpu::BackendBuffer<C> packed_buffer(std::max<int64_t>(1, panels * VL * K));
  C* packed = packed_buffer.get();
  PackPanels<V>(P, K, packed);

  // Blocks by bytes: a KC x MC slice of packed P (384 KiB) in L2, a KC x S slice of Q in L1 (12 KiB
  // with AVX-512); timings vary by a few % only between KC = 256 and 768.
  constexpr int64_t KC = 384 * 4 / sizeof(C);
  const int64_t mc_panels = std::max<int64_t>(1, 256 * 4 / static_cast<int64_t>(sizeof(C)) / VL);
  const int64_t r_blocks = (panels + mc_panels - 1) / mc_panels;
  // Q rows per task: a multiple of S, small enough that the pool has several tasks per thread.
  int64_t nc = S * ((256 + S - 1) / S);
  while (nc > S && r_blocks * ((Q.rows + nc - 1) / nc) < 4 * num_threads()) nc = S * ((nc / 2 + S - 1) / S);
  const int64_t s_chunks = (Q.rows + nc - 1) / nc;

  // A block of P small enough to stay in L2 whole (its real panels: a few rows of x are one):
  // each Q tile goes through all of K at once, so Q (often the weight, read from memory once)
  // streams row by row; else K blocks outermost.
  const bool q_rows_outer = std::min(mc_panels, panels) * VL * K * static_cast<int64_t>(sizeof(C)) <= (512 << 10);

  // Tasks of less than ~2^18 multiply-adds share a thread: waking one costs more than that.
  const int64_t task_work = mc_panels * VL * nc * std::max<int64_t>(1, K);
  parallel_for(r_blocks * s_chunks, std::max<int64_t>(1, (1 << 18) / task_work), [&](int64_t begin, int64_t end) {
    const int64_t ldc = mc_panels * VL;
    // Kept per thread: allocated per task, the 256 KiB scratch alone cost 64 page faults each time.
    Sum* scratch = cpu::thread_scratch<Sum, 0>(nc * ldc);
    C* qbuf = cpu::thread_scratch<C, 1>(S * KC);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t panel0 = task / s_chunks * mc_panels, panel1 = std::min(panels, panel0 + mc_panels);
      const int64_t s0 = task % s_chunks * nc, s1 = std::min(Q.rows, s0 + nc);
      // Rows s..s+S of Q against the block's panels over p0..p0+KC; the last K block finishes them.
      const auto step = [&](int64_t s, int64_t p0, Ahead ahead) {
        const int64_t kc = std::min(KC, K - p0), valid = std::min<int64_t>(S, s1 - s);
        const C* q[S];
        QRows(Q, s, valid, p0, kc, qbuf, KC, q);
        for (int64_t panel = panel0; panel < panel1; ++panel, ahead = {}) {
          Sum* c = scratch + (s - s0) * ldc + (panel - panel0) * VL;
          // Nothing to prefetch: the loop without the check (with it, 1024^3 float32 looked 3-7%
          // slower, near this VM's noise).
          const C* pp = packed + (panel * K + p0) * VL;
          if constexpr (kPairs) {
            if (ahead.lines > 0) PairTile<S, V, true>(d, pp, q, kc, c, ldc, p0 > 0, ahead);
            else PairTile<S, V, false>(d, pp, q, kc, c, ldc, p0 > 0, ahead);
          } else {
            if (ahead.lines > 0) Tile<V, true>(d, pp, q, kc, c, ldc, p0 > 0, ahead);
            else Tile<V, false>(d, pp, q, kc, c, ldc, p0 > 0, ahead);
          }
          if (p0 + kc < K) continue;
          const int64_t r0 = panel * VL, rows = std::min(VL, P.rows - r0);
          if (p_is_a) epi.Cols(r0, s, c, ldc, rows, valid);
          else
            for (int64_t j = 0; j < valid; ++j) epi.Row(s + j, r0, c + j * ldc, rows);
        }
      };
      const int64_t k_blocks = std::max<int64_t>(1, (K + KC - 1) / KC);  // one (empty) block when K = 0
      if (q_rows_outer) {
        for (int64_t s = s0; s < s1; s += S) {
          // Q's next S rows (this task's), where they lie one after another, prefetched in memory
          // order while these go through K: a share per K block.
          const int64_t next_rows = std::min<int64_t>(S, s1 - s - S);
          const int64_t lines = Q.ps == 1 && Q.rs == K && next_rows > 0
                                    ? (next_rows * K * static_cast<int64_t>(sizeof(TQ)) + 63) / 64 : 0;
          const char* next = lines > 0 ? reinterpret_cast<const char*>(Q.data + (s + S) * Q.rs) : nullptr;
          for (int64_t b = 0; b < k_blocks; ++b) {
            const int64_t from = lines * b / k_blocks, to = lines * (b + 1) / k_blocks;
            step(s, b * KC, Ahead{next + from * 64, to - from});
          }
        }
      } else {
        for (int64_t b = 0; b < k_blocks; ++b)
          for (int64_t s = s0; s < s1; s += S) step(s, b * KC, Ahead{});
      }
    }
  });
}

}  // namespace opforge::gemm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_OPS_LINEAR_ACT_GEMM_INL_H_
