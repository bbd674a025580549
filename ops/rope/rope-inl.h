// The rotation rope and rope_backward share, re-included once per Highway target like the
// kernels using it. Work is cut into groups of rows that share a position (all heads of one
// [..., p, :, :]); each group converts its cos/sin row to the compute type once, and every
// head row is then one SIMD pass.
#if defined(OPFORGE_OPS_ROPE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_OPS_ROPE_INL_H_
#undef OPFORGE_OPS_ROPE_INL_H_
#else
#define OPFORGE_OPS_ROPE_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <vector>

#include "opforge/cpu/rows-inl.h"
#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"
#include "opforge/cpu/visit.h"
#include "opforge/kernel.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::rope_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;

// Half-split pairs (i, i + half): out = (a*c - b*s, a*s + b*c).
template <typename T, typename C = Compute<T>>
HWY_INLINE void HalfRow(T* HWY_RESTRICT out, const T* HWY_RESTRICT x, const C* HWY_RESTRICT c,
                        const C* HWY_RESTRICT s, int64_t half) {
  const hn::ScalableTag<C> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= half; i += lanes) {
    const auto a = LoadAs(d, x + i), b = LoadAs(d, x + half + i);
    const auto vc = hn::LoadU(d, c + i), vs = hn::LoadU(d, s + i);
    StoreAs(d, hn::MulSub(a, vc, hn::Mul(b, vs)), out + i);
    StoreAs(d, hn::MulAdd(a, vs, hn::Mul(b, vc)), out + half + i);
  }
  for (; i < half; ++i) {
    const C a = ToCompute(x[i]), b = ToCompute(x[half + i]);
    out[i] = FromCompute<T>(ScalarMulAdd(a, c[i], -(b * s[i])));
    out[half + i] = FromCompute<T>(ScalarMulAdd(a, s[i], b * c[i]));
  }
}

// Interleaved pairs (2i, 2i + 1) with tables spread to full width, c2 = (c0, c0, c1, c1, ...)
// and s2 = (-s0, s0, -s1, s1, ...): out = x * c2 + (x with each pair swapped) * s2.
template <typename T, typename C = Compute<T>>
HWY_INLINE void InterleavedRow(T* HWY_RESTRICT out, const T* HWY_RESTRICT x, const C* HWY_RESTRICT c2,
                               const C* HWY_RESTRICT s2, int64_t dim) {
  const hn::ScalableTag<C> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  if (lanes >= 2) {  // lanes is even then, so vectors never split a pair
    for (; i + lanes <= dim; i += lanes) {
      const auto v = LoadAs(d, x + i);
      StoreAs(d, hn::MulAdd(v, hn::LoadU(d, c2 + i), hn::Mul(hn::Reverse2(d, v), hn::LoadU(d, s2 + i))), out + i);
    }
  }
  for (; i < dim; ++i) out[i] = FromCompute<T>(ScalarMulAdd(ToCompute(x[i]), c2[i], ToCompute(x[i ^ 1]) * s2[i]));
}

// A head's row is short (128 values: 512 bytes) and read as two halves side by side, which the
// hardware prefetchers follow poorly from DRAM: 64 MiB of float32 took 5.2 ms on one thread,
// against 3.1 for add's two streams (Zen 5 VM). The row this many rows later in the walk is
// prefetched meanwhile (3.8-4.1 ms; 4 to 16 rows ahead measured the same).
inline constexpr int64_t kRowsAhead = 8;

// out = x rotated by the tables' angles, or by their negatives when `inverse`.
template <typename T>
void RotateTyped(const TensorView& x, const TensorView& cos, const TensorView& sin, bool interleaved, bool inverse,
                 const TensorView& out) {
  using C = Compute<T>;
  const int64_t rank = x.rank();
  const int64_t dim = x.size(-1), half = dim / 2, heads = x.size(-2), seq = x.size(-3);
  const int64_t groups = x.numel() / (heads * dim);
  const T* src = x.data_as<const T>();
  const T* cos_data = cos.data_as<const T>();
  const T* sin_data = sin.data_as<const T>();
  T* dst = out.data_as<T>();
  const int64_t step = x.stride(-1), head_stride = x.stride(-2);
  const C sign = inverse ? C(-1) : C(1);
  parallel_for(groups, std::max<int64_t>(1, (1 << 15) / (heads * dim)), [&](int64_t begin, int64_t end) {
    std::vector<C> table(2 * dim);  // half-split uses c = table[0, half), s = table[dim, dim + half)
    C* c = table.data();
    C* s = table.data() + dim;
    std::vector<T> row_copy(step == 1 ? 0 : dim);
    const T* next_group = src + cpu::offset_of(begin, x.shape.data(), x.strides.data(), rank - 2);
    for (int64_t g = begin; g < end; ++g) {
      const T* group = next_group;
      next_group = g + 1 < end ? src + cpu::offset_of(g + 1, x.shape.data(), x.strides.data(), rank - 2) : nullptr;
      const int64_t p = g % seq;
      for (int64_t i = 0; i < half; ++i) {
        const C ci = ToCompute(cos_data[p * cos.strides[0] + i * cos.strides[1]]);
        const C si = sign * ToCompute(sin_data[p * sin.strides[0] + i * sin.strides[1]]);
        if (interleaved) {
          c[2 * i] = c[2 * i + 1] = ci;
          s[2 * i] = -si;
          s[2 * i + 1] = si;
        } else {
          c[i] = ci;
          s[i] = si;
        }
      }
      // The row kRowsAhead rows later in this task's walk (nullptr past its end).
      const auto later = [&](int64_t h) -> const T* {
        const int64_t at = h + kRowsAhead;
        if (at < heads) return group + at * head_stride;
        return next_group && at - heads < heads ? next_group + (at - heads) * head_stride : nullptr;
      };
      for (int64_t h = 0; h < heads; ++h) {
        const T* row = group + h * head_stride;
        if (step == 1) PrefetchBytes(later(h), dim * static_cast<int64_t>(sizeof(T)));
        if (step != 1) {
          for (int64_t i = 0; i < dim; ++i) row_copy[i] = row[i * step];
          row = row_copy.data();
        }
        T* o = dst + (g * heads + h) * dim;
        if (interleaved) InterleavedRow(o, row, c, s, dim);
        else HalfRow(o, row, c, s, half);
      }
    }
  });
}

inline void Rotate(const KernelCall& call, const char* op, const TensorView& x, bool inverse) {
  cpu::visit_float(x.dtype, op, [&](auto tag) {
    RotateTyped<decltype(tag)>(x, call.tensor("cos"), call.tensor("sin"), call.attr_bool("interleaved"), inverse,
                               call.output());
  });
}

}  // namespace opforge::rope_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_OPS_ROPE_INL_H_
