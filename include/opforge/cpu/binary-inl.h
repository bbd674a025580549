// The whole kernel of the broadcasting binary ops (add, mul): for_each_row's blocks of rows,
// each as one loop where one operand is dense and the other a repeated row, in L x L squares
// where an input is transposed, row by row (simd-inl.h's BinaryRow) otherwise. Re-included once
// per Highway target, like the kernels using it.
#if defined(OPFORGE_CPU_BINARY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_CPU_BINARY_INL_H_
#undef OPFORGE_CPU_BINARY_INL_H_
#else
#define OPFORGE_CPU_BINARY_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"
#include "opforge/cpu/transpose-inl.h"
#include "opforge/cpu/visit.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// out[c * n + i] = op(dense[c * n + i], row[i]) (op(row[i], dense[c * n + i]) unless kRowSecond)
// for c < count, i < n, n a whole number of vectors: a dense operand beside a row repeated along
// it (an [R, C] activation by a [C] bias, channels-last by a per-channel scale) as one loop whose
// row index wraps.
template <bool kRowSecond, typename T, class Op>
HWY_INLINE void DenseByRepeatedRow(T* HWY_RESTRICT out, const T* HWY_RESTRICT dense, const T* HWY_RESTRICT row,
                                   int64_t n, int64_t count, const Op& op) {
  const hn::ScalableTag<Compute<T>> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t total = n * count;
  for (int64_t i = 0, j = 0; i < total; i += lanes) {
    const auto v = LoadAs(d, dense + i), w = LoadAs(d, row + j);
    if constexpr (kRowSecond) StoreAs(d, op(d, v, w), out + i);
    else StoreAs(d, op(d, w, v), out + i);
    j += lanes;
    if (j == n) j = 0;
  }
}

// BinaryRow over a block of rows (for_each_row's Rows; operand 0 is out, 1 is a, 2 is b): one
// loop where one operand is dense across the rows and the other a repeated row, row by row
// otherwise.
template <typename T, class Op>
HWY_INLINE void BinaryRows(T* out, const T* a, const T* b, const Rows<3>& r, const Op& op) {
  const auto piece = [&](int64_t c, int64_t j, int64_t n) {
    BinaryRow(out + r.at(0, c) + j, a + r.at(1, c) + j * r.inner[1], r.inner[1], b + r.at(2, c) + j * r.inner[2],
              r.inner[2], n, op);
  };
  if (MapSquares<T, 3>(out, {a, b}, r, op, piece)) return;  // a tile with a transposed input
  if (MapRowPairs<T, 3>(out, {a, b}, r, op, piece)) return;  // rows of half a vector
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<Compute<T>>()));
  const bool unit_steps = r.inner[0] == 1 && r.inner[1] == 1 && r.inner[2] == 1;
  if (r.count > 1 && unit_steps && r.len % lanes == 0 && r.outer[0] == r.len) {
    if (r.outer[1] == r.len && r.outer[2] == 0)
      return DenseByRepeatedRow<true>(out + r.offsets[0], a + r.offsets[1], b + r.offsets[2], r.len, r.count, op);
    if (r.outer[1] == 0 && r.outer[2] == r.len)
      return DenseByRepeatedRow<false>(out + r.offsets[0], b + r.offsets[2], a + r.offsets[1], r.len, r.count, op);
  }
  EachRowPrefetching<T, 3>({a, b}, r, piece);
}

// out = op(x, y) for the numeric dtypes, x and y broadcast to out's shape (stride 0 along
// broadcast dimensions, so a broadcast row or scalar stays a SIMD loop), rows split across
// threads. The whole kernel of add and mul; `name` is the op's, for dtype errors.
template <class Op>
void BroadcastBinary(const char* name, const TensorView& x, const TensorView& y, const TensorView& out,
                     const Op& op) {
  visit_numeric(x.dtype, name, [&](auto tag) {
    using T = decltype(tag);
    const T* a = x.data_as<const T>();
    const T* b = y.data_as<const T>();
    T* dst = out.data_as<T>();
    for_each_row<3>(out.shape,
                    {contiguous_strides(out.shape), broadcast_strides(x, out.shape), broadcast_strides(y, out.shape)},
                    1 << 15, [&](const Rows<3>& r) { BinaryRows(dst, a, b, r, op); });
  });
}

}  // namespace opforge::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_CPU_BINARY_INL_H_
