// add_backward on the CPU: each operand's gradient is grad summed over the dimensions the
// operand was broadcast along. grad's dimensions are split into kept ones (the result is
// row-major over them) and summed ones. When grad's innermost dimension is kept, SIMD adds
// whole rows of grad into rows of accumulators; when it is summed, SIMD sums along it.
// Work is cut into output tiles and chunks of the summed range whose sizes depend on the
// shapes only, and chunk partials are added in chunk order: results are bitwise the same
// whatever the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/add_backward/add_backward_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"
#include "opforge/cpu/visit.h"
#include "opforge/registry.h"

#ifndef OPFORGE_ADD_BACKWARD_PLAN_
#define OPFORGE_ADD_BACKWARD_PLAN_  // target-independent: defined once, not per target
namespace opforge::add_backward_cpu {

inline constexpr int64_t kWork = 1 << 15;  // grad elements per work item, roughly
inline constexpr int64_t kMaxItems = 64;   // caps the chunk partials kept in memory

// grad's dimensions without size-1 ones, neighbours merged, split by what the operand does
// with them. m outputs, each the sum of r grad elements.
struct Plan {
  std::vector<int64_t> kept_size, kept_stride, red_size, red_stride;
  bool inner_kept = true;
  int64_t m = 1, r = 1;
  int64_t tile = 1, tiles = 1, chunks = 1;
};

inline Plan make_plan(const TensorView& grad, const std::vector<int64_t>& shape) {
  Plan p;
  const size_t lead = grad.shape.size() - shape.size();
  bool any = false;
  for (size_t d = 0; d < grad.shape.size(); ++d) {
    const int64_t size = grad.shape[d], stride = grad.strides[d];
    if (size == 1) continue;
    const bool kept = d >= lead && shape[d - lead] == size;
    auto& sizes = kept ? p.kept_size : p.red_size;
    auto& strides = kept ? p.kept_stride : p.red_stride;
    if (any && p.inner_kept == kept && strides.back() == stride * size) {
      sizes.back() *= size;
      strides.back() = stride;
    } else {
      sizes.push_back(size);
      strides.push_back(stride);
    }
    any = true;
    p.inner_kept = kept;
  }
  for (int64_t s : p.kept_size) p.m *= s;
  for (int64_t s : p.red_size) p.r *= s;
  // Kept-inner tiles stay long enough for SIMD; the summed range is split only as far as
  // needed to give every item about kWork elements.
  p.tile = std::min(p.m, std::max<int64_t>(p.inner_kept ? 1024 : 1, kWork / p.r));
  p.tiles = (p.m + p.tile - 1) / p.tile;
  const int64_t want = (p.tile * p.r + kWork - 1) / kWork;
  p.chunks = std::clamp<int64_t>(std::min(want, kMaxItems / p.tiles), 1, p.r);
  return p;
}

// Row-major walk over the first `rank` of (size, stride), tracking the element offset.
class Walker {
 public:
  Walker(const std::vector<int64_t>& size, const std::vector<int64_t>& stride, int64_t rank)
      : size_(size), stride_(stride), rank_(rank), index_(rank) {}
  void seek(int64_t linear) {
    offset_ = 0;
    for (int64_t d = rank_ - 1; d >= 0; --d) {
      index_[d] = linear % size_[d];
      offset_ += index_[d] * stride_[d];
      linear /= size_[d];
    }
  }
  void next() {
    for (int64_t d = rank_ - 1; d >= 0; --d) {
      offset_ += stride_[d];
      if (++index_[d] < size_[d]) return;
      offset_ -= stride_[d] * size_[d];
      index_[d] = 0;
    }
  }
  int64_t offset() const { return offset_; }

 private:
  const std::vector<int64_t>& size_;
  const std::vector<int64_t>& stride_;
  int64_t rank_;
  std::vector<int64_t> index_;
  int64_t offset_ = 0;
};

}  // namespace opforge::add_backward_cpu
#endif  // OPFORGE_ADD_BACKWARD_PLAN_

HWY_BEFORE_NAMESPACE();
namespace opforge::add_backward_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;

// acc[i] += src[i * stride] for i < n. Each lane adds in the same order as the scalar tail.
template <typename T>
HWY_INLINE void AddRow(Compute<T>* HWY_RESTRICT acc, const T* HWY_RESTRICT src, int64_t stride, int64_t n) {
  const hn::ScalableTag<Compute<T>> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  if (stride == 1)
    for (; i + lanes <= n; i += lanes) hn::StoreU(hn::Add(hn::LoadU(d, acc + i), LoadAs(d, src + i)), d, acc + i);
  for (; i < n; ++i) acc[i] += ToCompute(src[i * stride]);
}

// The sum of src[i * stride] for i < n; four accumulators hide the add latency.
template <typename T>
HWY_INLINE Compute<T> RowSum(const T* HWY_RESTRICT src, int64_t stride, int64_t n) {
  using C = Compute<T>;
  const hn::ScalableTag<C> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  C sum = 0;
  if (stride == 1 && n >= lanes) {
    auto acc0 = hn::Zero(d), acc1 = hn::Zero(d), acc2 = hn::Zero(d), acc3 = hn::Zero(d);
    for (; i + 4 * lanes <= n; i += 4 * lanes) {
      acc0 = hn::Add(acc0, LoadAs(d, src + i));
      acc1 = hn::Add(acc1, LoadAs(d, src + i + lanes));
      acc2 = hn::Add(acc2, LoadAs(d, src + i + 2 * lanes));
      acc3 = hn::Add(acc3, LoadAs(d, src + i + 3 * lanes));
    }
    for (; i + lanes <= n; i += lanes) acc0 = hn::Add(acc0, LoadAs(d, src + i));
    sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(acc0, acc1), hn::Add(acc2, acc3))));
  }
  for (; i < n; ++i) sum += ToCompute(src[i * stride]);
  return sum;
}

template <typename T>
HWY_INLINE void StoreRow(T* HWY_RESTRICT out, const Compute<T>* HWY_RESTRICT acc, int64_t n) {
  const hn::ScalableTag<Compute<T>> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) StoreAs(d, hn::LoadU(d, acc + i), out + i);
  for (; i < n; ++i) out[i] = FromCompute<T>(acc[i]);
}

// Sums grad's elements of outputs [o0, o1) over the summed range [r0, r1) into acc.
template <typename T>
void SumTile(const Plan& p, const T* grad, int64_t o0, int64_t o1, int64_t r0, int64_t r1, Compute<T>* acc) {
  std::fill(acc, acc + (o1 - o0), Compute<T>(0));
  const int64_t nk = static_cast<int64_t>(p.kept_size.size());
  const int64_t nr = static_cast<int64_t>(p.red_size.size());
  if (p.inner_kept) {
    const int64_t len = p.kept_size.back(), step = p.kept_stride.back();
    Walker summed(p.red_size, p.red_stride, nr);
    for (int64_t o = o0; o < o1;) {
      const int64_t col = o % len, run = std::min(len - col, o1 - o);
      const T* row = grad + cpu::offset_of(o / len, p.kept_size.data(), p.kept_stride.data(), nk - 1) + col * step;
      summed.seek(r0);
      for (int64_t r = r0; r < r1; ++r, summed.next()) AddRow(acc + (o - o0), row + summed.offset(), step, run);
      o += run;
    }
  } else {
    const int64_t len = p.red_size.back(), step = p.red_stride.back();
    Walker kept(p.kept_size, p.kept_stride, nk);
    Walker outer(p.red_size, p.red_stride, nr - 1);  // the summed dims but the innermost
    kept.seek(o0);
    for (int64_t o = o0; o < o1; ++o, kept.next()) {
      Compute<T> sum = 0;
      outer.seek(r0 / len);
      for (int64_t r = r0, col = r0 % len; r < r1; col = 0, outer.next()) {
        const int64_t run = std::min(len - col, r1 - r);
        sum += RowSum(grad + kept.offset() + outer.offset() + col * step, step, run);
        r += run;
      }
      acc[o - o0] = sum;
    }
  }
}

struct Identity {
  template <class D>
  HWY_INLINE hn::Vec<D> operator()(D, hn::Vec<D> v) const { return v; }
  template <class C>
  HWY_INLINE C operator()(C v) const { return v; }
};

template <typename T>
void Reduce(const TensorView& grad, const TensorView& out) {
  using C = Compute<T>;
  if (out.numel() == 0) return;
  if (grad.numel() == 0) {  // a size-0 dimension summed away: the sum of nothing
    std::memset(out.data, 0, static_cast<size_t>(out.nbytes()));
    return;
  }
  const T* g = grad.data_as<const T>();
  T* dst = out.data_as<T>();
  const Plan p = make_plan(grad, out.shape);
  if (p.r == 1) {  // nothing summed: a copy, which the row walker does at memory speed
    cpu::for_each_row<2>(grad.shape, {contiguous_strides(grad.shape), grad.strides}, 1 << 15,
                         [&](const cpu::Row<2>& r) {
                           UnaryRow(dst + r.offsets[0], g + r.offsets[1], r.inner[1], r.len, Identity{});
                         });
    return;
  }
  std::vector<C> partial(p.chunks > 1 ? p.chunks * p.m : 0);
  parallel_for(p.tiles * p.chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<C> local(p.chunks > 1 ? 0 : p.tile);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / p.chunks, k = item % p.chunks;
      const int64_t o0 = t * p.tile, o1 = std::min(p.m, o0 + p.tile);
      const int64_t r0 = p.r * k / p.chunks, r1 = p.r * (k + 1) / p.chunks;
      C* acc = p.chunks > 1 ? partial.data() + k * p.m + o0 : local.data();
      SumTile(p, g, o0, o1, r0, r1, acc);
      if (p.chunks == 1) StoreRow(dst + o0, acc, o1 - o0);
    }
  });
  if (p.chunks == 1) return;
  for (int64_t o = 0; o < p.m; ++o) {  // chunk order, whichever thread summed each chunk
    C sum = partial[o];
    for (int64_t k = 1; k < p.chunks; ++k) sum += partial[k * p.m + o];
    dst[o] = FromCompute<T>(sum);
  }
}

void Run(const KernelCall& call) {
  const TensorView& grad = call.tensor("grad");
  cpu::visit_float(grad.dtype, "add_backward", [&](auto tag) {
    using T = decltype(tag);
    Reduce<T>(grad, call.output(0));
    Reduce<T>(grad, call.output(1));
  });
}

}  // namespace opforge::add_backward_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::add_backward_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(add_backward, "cpu", float_dtypes(), run);
}  // namespace opforge::add_backward_cpu
#endif
