// Elementwise ops over a tile whose inputs disagree with the output on which dimension is
// contiguous (x.T + y, grad.T beside x): each input read a square of L x L lanes at a time, a
// transposed one as L contiguous columns transposed in registers, so every load is a whole vector
// (walked row by row, such an input costs a gather per vector: ~20 cycles on AMD, and 2048 x 2048
// float32 x.T + y ran at 14x the contiguous add's time on one thread). Re-included once per Highway
// target, like the kernels using it.
#if defined(OPFORGE_CPU_TRANSPOSE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_CPU_TRANSPOSE_INL_H_
#undef OPFORGE_CPU_TRANSPOSE_INL_H_
#else
#define OPFORGE_CPU_TRANSPOSE_INL_H_
#endif

#include <hwy/highway.h>

#include <array>
#include <cstdint>
#include <utility>

#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// How an input of a tile reads: `rows` (inner step 1), a value per row (inner step 0: a column
// broadcast along the rows) or `columns` (outer step 1: transposed); nothing else takes squares.
enum class TileRead { kRows, kRowValue, kColumns, kNone };

inline TileRead tile_read(int64_t outer, int64_t inner) {
  if (inner == 1) return TileRead::kRows;
  if (inner == 0) return TileRead::kRowValue;
  if (outer == 1) return TileRead::kColumns;
  return TileRead::kNone;
}

// The side of the squares for compute type C on this target: its lanes, or 0 where there are
// no squares. They need vectors of a fixed lane count (arrays of them), more than one lane, and
// lanes of 4 or 8 bytes (the stages below).
template <typename C>
inline constexpr int64_t kSquareLanes =
    (HWY_HAVE_SCALABLE || HWY_TARGET == HWY_SCALAR || (sizeof(C) != 4 && sizeof(C) != 8))
        ? 0
        : static_cast<int64_t>(hn::MaxLanes(hn::ScalableTag<C>()));

#if !HWY_HAVE_SCALABLE && HWY_TARGET != HWY_SCALAR

// One stage of the transpose: rows i and i + kS (i without bit kS) trade their units of kS
// lanes where the unit's index has bit kS set and the row's has not, which moves element
// (i, j) to (i ^ kS, j ^ kS) where bit kS of i and j differ. The stages for every bit of the
// lane index together swap i and j: a transpose, in any order.
template <size_t kS, class D, size_t L>
HWY_INLINE void TradeUnits(D d, hn::Vec<D> (&v)[L]) {
  using T = hn::TFromD<D>;
  constexpr size_t kUnitBytes = kS * sizeof(T);
  const hn::Repartition<uint64_t, D> d64;
  for (size_t i = 0; i < L; ++i) {
    if (i & kS) continue;
    const hn::Vec<D> a = v[i], b = v[i + kS];
    if constexpr (kS * 2 == L) {  // halves
      v[i] = hn::ConcatLowerLower(d, b, a);
      v[i + kS] = hn::ConcatUpperUpper(d, b, a);
    } else if constexpr (kUnitBytes == 16) {  // 128-bit blocks of a 512-bit vector
      v[i] = hn::OddEvenBlocks(hn::SwapAdjacentBlocks(b), a);
      v[i + kS] = hn::OddEvenBlocks(b, hn::SwapAdjacentBlocks(a));
    } else if constexpr (kUnitBytes == 8) {  // 64-bit halves of each 128-bit block
      v[i] = hn::BitCast(d, hn::InterleaveLower(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
      v[i + kS] = hn::BitCast(d, hn::InterleaveUpper(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
    } else {  // 32-bit lanes within each 64-bit pair
      static_assert(kUnitBytes == 4, "square tiles take 4- and 8-byte lanes");
      v[i] = hn::OddEven(hn::BitCast(d, hn::ShiftLeft<32>(hn::BitCast(d64, b))), a);
      v[i + kS] = hn::OddEven(b, hn::BitCast(d, hn::ShiftRight<32>(hn::BitCast(d64, a))));
    }
  }
}

template <size_t kS, class D, size_t L>
HWY_INLINE void TransposeStages(D d, hn::Vec<D> (&v)[L]) {
  if constexpr (kS >= 1) {
    TradeUnits<kS>(d, v);
    TransposeStages<kS / 2>(d, v);
  }
}

// v[i] lane j becomes v[j] lane i: L vectors of L lanes transposed in registers.
template <class D, size_t L>
HWY_INLINE void TransposeSquare(D d, hn::Vec<D> (&v)[L]) {
  static_assert(L == hn::MaxLanes(D()), "a square of the vector's lanes");
  TransposeStages<L / 2>(d, v);
}

// v[p] = the square's row c0 + p, columns j0 .. j0 + L, of an input at p0 (its block's start).
template <typename T, class D, size_t L>
HWY_INLINE void LoadSquare(D d, const T* HWY_RESTRICT p0, int64_t outer, int64_t inner, TileRead how, int64_t c0,
                           int64_t j0, hn::Vec<D> (&v)[L]) {
  if (how == TileRead::kColumns) {
    for (size_t q = 0; q < L; ++q) v[q] = LoadAs(d, p0 + c0 + (j0 + static_cast<int64_t>(q)) * inner);
    return TransposeSquare(d, v);
  }
  for (size_t p = 0; p < L; ++p) {
    const T* row = p0 + (c0 + static_cast<int64_t>(p)) * outer;
    v[p] = how == TileRead::kRows ? LoadAs(d, row + j0) : hn::Set(d, ToCompute(*row));
  }
}

template <class Op, class D, class V, size_t M, size_t L, size_t... K>
HWY_INLINE V ApplySquare(const Op& op, D d, const V (&in)[M][L], size_t p, std::index_sequence<K...>) {
  return op(d, in[K][p]...);
}

#endif  // !HWY_HAVE_SCALABLE && HWY_TARGET != HWY_SCALAR

// out = op(inputs) over a block of rows (for_each_row's Rows, operand 0 the contiguous output,
// 1.. the inputs) where some input is transposed (outer step 1): the block's whole L x L squares
// here, the rest (rows past the last whole group of L, columns past the last whole square) by
// piece(c, j, n), which does the n elements from column j of row c. False, with nothing done,
// for any other block: the caller walks it row by row. Same op on the same values: same bits.
template <typename T, size_t N, class Op, class Piece>
HWY_INLINE bool MapSquares(T* HWY_RESTRICT out, const std::array<const T*, N - 1>& in, const Rows<N>& r,
                           const Op& op, const Piece& piece) {
#if HWY_HAVE_SCALABLE || HWY_TARGET == HWY_SCALAR
  return false;
#else
  constexpr int64_t kL = kSquareLanes<Compute<T>>;
  if constexpr (kL == 0) {
    return false;
  } else {
    const hn::ScalableTag<Compute<T>> d;
    constexpr size_t L = static_cast<size_t>(kL);
    if (r.inner[0] != 1 || r.count < kL || r.len < kL) return false;
    std::array<TileRead, N - 1> how;
    bool transposed = false;
    for (size_t k = 0; k + 1 < N; ++k) {
      how[k] = tile_read(r.outer[k + 1], r.inner[k + 1]);
      if (how[k] == TileRead::kNone) return false;
      transposed = transposed || how[k] == TileRead::kColumns;
    }
    if (!transposed) return false;
    const int64_t rows = r.count / kL * kL, cols = r.len / kL * kL;
    for (int64_t c0 = 0; c0 < rows; c0 += kL) {
      for (int64_t j0 = 0; j0 < cols; j0 += kL) {
        hn::Vec<decltype(d)> v[N - 1][L];
        for (size_t k = 0; k + 1 < N; ++k)
          LoadSquare(d, in[k] + r.offsets[k + 1], r.outer[k + 1], r.inner[k + 1], how[k], c0, j0, v[k]);
        for (size_t p = 0; p < L; ++p)
          StoreAs(d, ApplySquare(op, d, v, p, std::make_index_sequence<N - 1>()),
                  out + r.at(0, c0 + static_cast<int64_t>(p)) + j0);
      }
      if (cols < r.len)
        for (int64_t c = c0; c < c0 + kL; ++c) piece(c, cols, r.len - cols);
    }
    for (int64_t c = rows; c < r.count; ++c) piece(c, 0, r.len);
    return true;
  }
#endif
}

// MapSquares where the block is a tile with a transposed input, piece(c, 0, len) row by row
// otherwise: the whole callback of a for_each_row walk without other fast paths.
template <typename T, size_t N, class Op, class Piece>
HWY_INLINE void MapSquaresOrRows(T* HWY_RESTRICT out, const std::array<const T*, N - 1>& in, const Rows<N>& r,
                                 const Op& op, const Piece& piece) {
  if (MapSquares<T, N>(out, in, r, op, piece)) return;
  for (int64_t c = 0; c < r.count; ++c) piece(c, 0, r.len);
}

}  // namespace opforge::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_CPU_TRANSPOSE_INL_H_
