// Summing elementwise terms down to a broadcast operand's shape: the gradients of broadcasting
// ops (add_backward sums grad, mul_backward sums grad * other). A term is the product of N
// operands (N = 1: the operand itself) walked over one iteration shape with their own strides,
// so a product is summed in the same pass that reads it, without a temporary.
//
// The iteration dimensions are split into kept ones (the result is row-major over them) and
// summed ones. When the innermost dimension is kept, SIMD adds whole rows of terms into rows
// of accumulators; when it is summed, SIMD sums along it. Work is cut into output tiles and
// chunks of the summed range whose sizes depend on the shapes only, and chunk partials are
// added in chunk order: results are bitwise the same whatever the thread count.
// Re-included once per Highway target, like the kernels using it.

#ifndef OPFORGE_CPU_SUM_TO_SHAPE_PLAN_
#define OPFORGE_CPU_SUM_TO_SHAPE_PLAN_  // target-independent: defined once, not per target
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "opforge/dims.h"

namespace opforge::cpu {

inline constexpr int64_t kSumWork = 1 << 15;  // terms per work item, roughly
inline constexpr int64_t kSumMaxItems = 64;   // caps the chunk partials kept in memory

// The iteration dimensions without size-1 ones, neighbours merged where every operand steps
// through them evenly, split by what the result does with them. m outputs, each a sum of r terms.
template <size_t N>
struct SumPlan {
  Dims kept_size, red_size;
  std::array<Dims, N> kept_stride, red_stride;
  bool inner_kept = true;
  int64_t m = 1, r = 1;
  int64_t tile = 1, tiles = 1, chunks = 1;
};

template <size_t N>
SumPlan<N> make_sum_plan(const Dims& shape, const std::array<Dims, N>& strides,
                         const Dims& out_shape) {
  SumPlan<N> p;
  const size_t lead = shape.size() - out_shape.size();
  bool any = false;
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t size = shape[d];
    if (size == 1) continue;
    const bool kept = d >= lead && out_shape[d - lead] == size;
    auto& sizes = kept ? p.kept_size : p.red_size;
    auto& st = kept ? p.kept_stride : p.red_stride;
    bool merge = any && p.inner_kept == kept;
    for (size_t k = 0; k < N && merge; ++k) merge = st[k].back() == strides[k][d] * size;
    if (merge) {
      sizes.back() *= size;
      for (size_t k = 0; k < N; ++k) st[k].back() = strides[k][d];
    } else {
      sizes.push_back(size);
      for (size_t k = 0; k < N; ++k) st[k].push_back(strides[k][d]);
    }
    any = true;
    p.inner_kept = kept;
  }
  for (int64_t s : p.kept_size) p.m *= s;
  for (int64_t s : p.red_size) p.r *= s;
  // Kept-inner tiles stay long enough for SIMD; the summed range is split only as far as
  // needed to give every item about kSumWork terms.
  p.tile = std::min(p.m, std::max<int64_t>(p.inner_kept ? 1024 : 1, kSumWork / p.r));
  p.tiles = (p.m + p.tile - 1) / p.tile;
  const int64_t want = (p.tile * p.r + kSumWork - 1) / kSumWork;
  p.chunks = std::clamp<int64_t>(std::min(want, kSumMaxItems / p.tiles), 1, p.r);
  return p;
}

// Row-major walk over the first `rank` dimensions, tracking every operand's element offset.
template <size_t N>
class SumWalker {
 public:
  SumWalker(const Dims& size, const std::array<Dims, N>& stride, int64_t rank)
      : size_(size), stride_(stride), rank_(rank), index_(rank) {}
  void seek(int64_t linear) {
    offset_.fill(0);
    for (int64_t d = rank_ - 1; d >= 0; --d) {
      index_[d] = linear % size_[d];
      for (size_t k = 0; k < N; ++k) offset_[k] += index_[d] * stride_[k][d];
      linear /= size_[d];
    }
  }
  void next() {
    for (int64_t d = rank_ - 1; d >= 0; --d) {
      for (size_t k = 0; k < N; ++k) offset_[k] += stride_[k][d];
      if (++index_[d] < size_[d]) return;
      for (size_t k = 0; k < N; ++k) offset_[k] -= stride_[k][d] * size_[d];
      index_[d] = 0;
    }
  }
  int64_t offset(size_t k) const { return offset_[k]; }

 private:
  const Dims& size_;
  const std::array<Dims, N>& stride_;
  int64_t rank_;
  Dims index_;
  std::array<int64_t, N> offset_{};
};

}  // namespace opforge::cpu
#endif  // OPFORGE_CPU_SUM_TO_SHAPE_PLAN_

#if defined(OPFORGE_CPU_SUM_TO_SHAPE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_CPU_SUM_TO_SHAPE_INL_H_
#undef OPFORGE_CPU_SUM_TO_SHAPE_INL_H_
#else
#define OPFORGE_CPU_SUM_TO_SHAPE_INL_H_
#endif

#include <hwy/highway.h>

#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"
#include "opforge/cpu/transpose-inl.h"
#include "opforge/tensor.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The terms along one run: operand k at p[k], stepping s[k].
template <typename T, size_t N>
struct Terms {
  std::array<const T*, N> p;
  std::array<int64_t, N> s;
};

// SIMD takes runs where operand 0 is contiguous and operand 1 (if any) contiguous or repeated
// (stride 0); products commute, so a contiguous operand 1 is swapped to the front.
template <typename T, size_t N>
HWY_INLINE bool Vectorizable(Terms<T, N>& t) {
  if constexpr (N == 2) {
    if (t.s[0] != 1 && t.s[1] == 1) {
      std::swap(t.p[0], t.p[1]);
      std::swap(t.s[0], t.s[1]);
    }
    return t.s[0] == 1 && (t.s[1] == 1 || t.s[1] == 0);
  } else {
    static_assert(N == 1, "terms are one operand or the product of two");
    return t.s[0] == 1;
  }
}

template <typename T, size_t N, class D>
HWY_INLINE hn::Vec<D> TermVec(D d, const Terms<T, N>& t, int64_t i) {
  if constexpr (N == 1) return LoadAs(d, t.p[0] + i);
  else return hn::Mul(LoadAs(d, t.p[0] + i), t.s[1] ? LoadAs(d, t.p[1] + i) : hn::Set(d, ToCompute(t.p[1][0])));
}

template <typename T, size_t N>
HWY_INLINE Compute<T> TermAt(const Terms<T, N>& t, int64_t i) {
  if constexpr (N == 1) return ToCompute(t.p[0][i * t.s[0]]);
  else return ToCompute(t.p[0][i * t.s[0]]) * ToCompute(t.p[1][i * t.s[1]]);
}

// acc[i] += term i, for i < n. Each lane adds in the same order as the scalar tail.
template <typename T, size_t N>
HWY_INLINE void AddRow(Compute<T>* HWY_RESTRICT acc, Terms<T, N> t, int64_t n) {
  const hn::ScalableTag<Compute<T>> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  if (Vectorizable(t))
    for (; i + lanes <= n; i += lanes) hn::StoreU(hn::Add(hn::LoadU(d, acc + i), TermVec(d, t, i)), d, acc + i);
  for (; i < n; ++i) acc[i] += TermAt(t, i);
}

// The sum of terms 0..n-1; four accumulators hide the add latency.
template <typename T, size_t N>
HWY_INLINE Compute<T> RowSum(Terms<T, N> t, int64_t n) {
  using C = Compute<T>;
  const hn::ScalableTag<C> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  C sum = 0;
  if (n >= lanes && Vectorizable(t)) {
    auto acc0 = hn::Zero(d), acc1 = hn::Zero(d), acc2 = hn::Zero(d), acc3 = hn::Zero(d);
    for (; i + 4 * lanes <= n; i += 4 * lanes) {
      acc0 = hn::Add(acc0, TermVec(d, t, i));
      acc1 = hn::Add(acc1, TermVec(d, t, i + lanes));
      acc2 = hn::Add(acc2, TermVec(d, t, i + 2 * lanes));
      acc3 = hn::Add(acc3, TermVec(d, t, i + 3 * lanes));
    }
    for (; i + lanes <= n; i += lanes) acc0 = hn::Add(acc0, TermVec(d, t, i));
    sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(acc0, acc1), hn::Add(acc2, acc3))));
  }
  for (; i < n; ++i) sum += TermAt(t, i);
  return sum;
}

// Sums the terms of outputs [o0, o1) over the summed range [r0, r1) into acc.
template <typename T, size_t N>
void SumTile(const SumPlan<N>& p, const std::array<const T*, N>& base, int64_t o0, int64_t o1, int64_t r0,
             int64_t r1, Compute<T>* acc) {
  std::fill(acc, acc + (o1 - o0), Compute<T>(0));
  const int64_t nk = static_cast<int64_t>(p.kept_size.size());
  const int64_t nr = static_cast<int64_t>(p.red_size.size());
  Terms<T, N> t;
  if (p.inner_kept) {
    const int64_t len = p.kept_size.back();
    SumWalker<N> summed(p.red_size, p.red_stride, nr);
    for (int64_t o = o0; o < o1;) {
      const int64_t col = o % len, run = std::min(len - col, o1 - o);
      std::array<const T*, N> row;
      for (size_t k = 0; k < N; ++k) {
        t.s[k] = p.kept_stride[k].back();
        row[k] = base[k] + offset_of(o / len, p.kept_size.data(), p.kept_stride[k].data(), nk - 1) + col * t.s[k];
      }
      summed.seek(r0);
      for (int64_t r = r0; r < r1; ++r, summed.next()) {
        for (size_t k = 0; k < N; ++k) t.p[k] = row[k] + summed.offset(k);
        AddRow(acc + (o - o0), t, run);
      }
      o += run;
    }
  } else {
    const int64_t len = p.red_size.back();
    SumWalker<N> kept(p.kept_size, p.kept_stride, nk);
    SumWalker<N> outer(p.red_size, p.red_stride, nr - 1);  // the summed dims but the innermost
    kept.seek(o0);
    for (int64_t o = o0; o < o1; ++o, kept.next()) {
      Compute<T> sum = 0;
      outer.seek(r0 / len);
      for (int64_t r = r0, col = r0 % len; r < r1; col = 0, outer.next()) {
        const int64_t run = std::min(len - col, r1 - r);
        for (size_t k = 0; k < N; ++k) {
          t.s[k] = p.red_stride[k].back();
          t.p[k] = base[k] + kept.offset(k) + outer.offset(k) + col * t.s[k];
        }
        sum += RowSum(t, run);
        r += run;
      }
      acc[o - o0] = sum;
    }
  }
}

struct SumIdentity {
  template <class D, class V>
  HWY_INLINE V operator()(D, V v) const { return v; }
  template <class C>
  HWY_INLINE C operator()(C v) const { return v; }
};

struct SumTimes {
  template <class D, class V>
  HWY_INLINE V operator()(D, V a, V b) const { return hn::Mul(a, b); }
  template <class C>
  HWY_INLINE C operator()(C a, C b) const { return a * b; }
};

// out = the terms over `shape` (operand k at base[k] with strides[k], broadcast strides
// allowed) summed down to out's shape, which `shape` broadcasts from. out is contiguous.
template <typename T, size_t N>
void SumToShape(const TensorView& out, const Dims& shape, const std::array<const T*, N>& base,
                const std::array<Dims, N>& strides) {
  using C = Compute<T>;
  if (out.numel() == 0) return;
  T* dst = out.data_as<T>();
  int64_t total = 1;
  for (int64_t s : shape) total *= s;
  if (total == 0) {  // a size-0 dimension summed away: the sum of nothing
    std::memset(out.data, 0, static_cast<size_t>(out.nbytes()));
    return;
  }
  const SumPlan<N> p = make_sum_plan<N>(shape, strides, out.shape);
  if (p.r == 1) {  // nothing summed: one elementwise pass at memory speed
    std::array<Dims, N + 1> walk;
    walk[0] = contiguous_strides(shape);
    for (size_t k = 0; k < N; ++k) walk[k + 1] = strides[k];
    // Blocks of rows: a transposed operand's tiles go in squares (transpose-inl.h).
    for_each_row<N + 1>(shape, walk, 1 << 15, [&](const Rows<N + 1>& r) {
      const auto piece = [&](int64_t c, int64_t j, int64_t n) {
        T* o = dst + r.at(0, c) + j;
        const T* a = base[0] + r.at(1, c) + j * r.inner[1];
        if constexpr (N == 1)
          UnaryRow(o, a, r.inner[1], n, SumIdentity{});
        else
          BinaryRow(o, a, r.inner[1], base[1] + r.at(2, c) + j * r.inner[2], r.inner[2], n, SumTimes{});
      };
      if constexpr (N == 1) MapSquaresOrRows<T, 2>(dst, {base[0]}, r, SumIdentity{}, piece);
      else MapSquaresOrRows<T, 3>(dst, {base[0], base[1]}, r, SumTimes{}, piece);
    });
    return;
  }
  std::vector<C> partial(p.chunks > 1 ? p.chunks * p.m : 0);
  parallel_for(p.tiles * p.chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<C> local(p.chunks > 1 ? 0 : p.tile);
    const hn::ScalableTag<C> d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / p.chunks, k = item % p.chunks;
      const int64_t o0 = t * p.tile, o1 = std::min(p.m, o0 + p.tile);
      const int64_t r0 = p.r * k / p.chunks, r1 = p.r * (k + 1) / p.chunks;
      C* acc = p.chunks > 1 ? partial.data() + k * p.m + o0 : local.data();
      SumTile<T, N>(p, base, o0, o1, r0, r1, acc);
      if (p.chunks > 1) continue;
      int64_t i = 0;
      for (; i + lanes <= o1 - o0; i += lanes) StoreAs(d, hn::LoadU(d, acc + i), dst + o0 + i);
      for (; i < o1 - o0; ++i) dst[o0 + i] = FromCompute<T>(acc[i]);
    }
  });
  if (p.chunks == 1) return;
  for (int64_t o = 0; o < p.m; ++o) {  // chunk order, whichever thread summed each chunk
    C sum = partial[o];
    for (int64_t k = 1; k < p.chunks; ++k) sum += partial[k * p.m + o];
    dst[o] = FromCompute<T>(sum);
  }
}

}  // namespace opforge::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_CPU_SUM_TO_SHAPE_INL_H_
