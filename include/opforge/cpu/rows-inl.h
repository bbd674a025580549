// Per-target helpers shared by the row-wise CPU kernels (softmax, layer_norm, rms_norm and their
// backward ops): each works on the last dimension, a row at a time, rows in parallel. Kept in
// one place so the kernels agree on when to stream, how much work a thread handoff is worth and
// how rows are split for bitwise-reproducible sums over rows. Re-included once per Highway
// target, like the kernels using it.
#if defined(OPFORGE_CPU_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_CPU_ROWS_INL_H_
#undef OPFORGE_CPU_ROWS_INL_H_
#else
#define OPFORGE_CPU_ROWS_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#if HWY_ARCH_X86
#include <immintrin.h>  // _mm_sfence
#endif

#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/strided.h"
#include "opforge/cpu/transpose-inl.h"
#include "opforge/tensor.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Elements per parallel chunk of rows, at least (torch's grain): less work costs less than a
// thread handoff.
inline constexpr int64_t kRowGrain = 1 << 15;

// Rows per parallel chunk for rows of n >= 1 elements.
HWY_INLINE int64_t RowsPerChunk(int64_t n, int64_t grain = kRowGrain) { return std::max<int64_t>(1, grain / n); }

// Outputs of at least this many bytes are written with non-temporal stores (see WriteRow).
inline constexpr int64_t kStreamBytes = 8 << 20;

template <typename T>
HWY_INLINE bool StreamsOutput(int64_t numel) {
  return numel * static_cast<int64_t>(sizeof(T)) >= kStreamBytes;
}

// out[0, n) = f(i) (a vector: the lanes from i on), fs(i) for single elements. With stream, the
// aligned float32/float64 body goes out as non-temporal stores: a big output would not stay
// in cache anyway, and skipping the read-for-ownership saves a third of the memory traffic.
// A thread that streamed calls StreamFence before handing its chunk back.
template <typename T, class F, class FS>
HWY_INLINE void WriteRow(T* HWY_RESTRICT out, int64_t n, bool stream, const F& f, const FS& fs) {
  const hn::ScalableTag<Compute<T>> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  if constexpr (std::is_same_v<T, Compute<T>>) {
    if (stream) {
      for (; i < n && reinterpret_cast<uintptr_t>(out + i) % (lanes * sizeof(T)) != 0; ++i) out[i] = fs(i);
      for (; i + lanes <= n; i += lanes) hn::Stream(f(i), d, out + i);
    }
  }
  for (; i + lanes <= n; i += lanes) StoreAs(d, f(i), out + i);
  for (; i < n; ++i) out[i] = FromCompute<T>(fs(i));
}

// Non-temporal stores are weakly ordered: fence them so they are visible before the pool hands
// the chunk back.
HWY_INLINE void StreamFence(bool stream) {
#if HWY_ARCH_X86
  if (stream) _mm_sfence();
#else
  (void)stream;
#endif
}

// Row r (of the leading dims of shape; last dim n) of a tensor at base with the given strides,
// as a contiguous pointer: gathered into buf when its elements are not adjacent, so the SIMD
// loops stay simple.
template <typename T>
const T* RowOf(const T* base, const Dims& shape, const Dims& strides, int64_t r,
               int64_t n, std::vector<T>& buf) {
  const T* row = base + offset_of(r, shape.data(), strides.data(), static_cast<int64_t>(shape.size()) - 1);
  const int64_t step = strides.back();
  if (step == 1) return row;
  buf.resize(n);
  for (int64_t i = 0; i < n; ++i) buf[i] = row[i * step];
  return buf.data();
}

// The rows of a tensor (its last dimension, n elements) as contiguous pointers, for a row kernel
// walking rows r = begin .. end - 1 in order. A row of stride 1 is used in place. Rows whose own
// elements are apart but which sit side by side (x.T, or x.mT of a batch: row r + 1 starts one
// element after row r) are copied a panel of rows at a time, each vector a whole load of L rows'
// elements and each square of L x L transposed in registers; row by row, a gather per element
// (2048 x 2048 float32 softmax(x.T) ran at 2-3x torch's time, which copies x.T contiguous first).
// Any other row is gathered on its own. shape and strides are held by reference (a source is
// made per chunk of rows, on every call of a row op): they must outlive it.
template <typename T>
class RowSource {
 public:
  RowSource(const T* base, const Dims& shape, const Dims& strides, int64_t n)
      : base_(base), shape_(shape), strides_(strides), n_(n) {
    const size_t rank = shape.size();
    if (kL > 1 && rank >= 2 && strides.back() != 1 && strides[rank - 2] == 1 && shape[rank - 2] >= kL && n >= kL) {
      // Panels of up to 4 squares' rows, within ~256 KiB: the kernel reads them back from L2.
      const int64_t row_bytes = n * static_cast<int64_t>(sizeof(T));
      panel_rows_ = kL * std::clamp<int64_t>((256 << 10) / (kL * row_bytes), 1, 4);
    }
  }
  RowSource(const TensorView& t, int64_t n) : RowSource(t.data_as<const T>(), t.shape, t.strides, n) {}

  // Rows a chunk of the walk should hold at least, for whole panels (1 without panels).
  int64_t panel_rows() const { return panel_rows_; }

  // Row r's elements; valid until the next call. [r, end) are rows the caller will read next.
  const T* row(int64_t r, int64_t end) {
    if (r >= panel_begin_ && r < panel_end_) return panel_.data() + (r - panel_begin_) * n_;
    if (panel_rows_ > 1 && FillPanel(r, end)) return panel_.data();
    return RowOf(base_, shape_, strides_, r, n_, gathered_);
  }

 private:
  static constexpr int64_t kL = kSquareLanes<Compute<T>>;  // 0: no squares, no panels

  // Rows r .. r + k (k a multiple of L, as many as the panel, the caller's rows and the rows of
  // r's matrix allow) into the panel; false where fewer than L are left.
  bool FillPanel(int64_t r, int64_t end) {
#if HWY_HAVE_SCALABLE || HWY_TARGET == HWY_SCALAR
    (void)r, (void)end;
    return false;
#else
    if constexpr (kL == 0) {
      return false;
    } else {
      const size_t rank = shape_.size();
      const int64_t in_matrix = shape_[rank - 2] - r % shape_[rank - 2];
      const int64_t count = std::min({panel_rows_, end - r, in_matrix}) / kL * kL;
      if (count < kL) return false;
      const hn::ScalableTag<Compute<T>> d;
      constexpr size_t L = static_cast<size_t>(kL);
      const T* first = base_ + offset_of(r, shape_.data(), strides_.data(), static_cast<int64_t>(rank) - 1);
      const int64_t step = strides_.back(), whole = n_ / kL * kL;
      panel_.resize(static_cast<size_t>(count * n_));
      for (int64_t c0 = 0; c0 < count; c0 += kL) {
        const T* rows = first + c0;  // rows c0 .. c0 + L of the panel, side by side
        T* dst = panel_.data() + c0 * n_;
        for (int64_t j0 = 0; j0 < whole; j0 += kL) {
          hn::Vec<decltype(d)> v[L];
          LoadSquare(d, rows, 0, step, TileRead::kColumns, 0, j0, v);
          for (size_t p = 0; p < L; ++p) StoreAs(d, v[p], dst + static_cast<int64_t>(p) * n_ + j0);
        }
        for (int64_t p = 0; p < kL; ++p)
          for (int64_t j = whole; j < n_; ++j) dst[p * n_ + j] = rows[p + j * step];
      }
      panel_begin_ = r;
      panel_end_ = r + count;
      return true;
    }
#endif
  }

  const T* base_;
  const Dims& shape_;
  const Dims& strides_;
  int64_t n_, panel_rows_ = 1, panel_begin_ = 0, panel_end_ = 0;
  std::vector<T> panel_, gathered_;
};

// Row r + 1 of t when the chunk [.., end) holds it and its elements are adjacent, else nullptr:
// what a row kernel hands to PrefetchBytes while it computes on row r.
template <typename T>
const T* NextRowOf(const TensorView& t, int64_t r, int64_t end, int64_t n) {
  if (r + 1 >= end || t.strides.back() != 1) return nullptr;
  return t.data_as<const T>() +
         offset_of(r + 1, t.shape.data(), t.strides.data(), static_cast<int64_t>(t.shape.size()) - 1);
}

// Asks the cache for [p, p + bytes), a prefetch per 64-byte line. A kernel whose passes over a
// row are compute-bound spreads the next row's lines over them, so that row's read from memory
// overlaps this row's arithmetic instead of following it (the hardware prefetcher only runs a
// few lines ahead of demand misses, and the compute passes make none).
HWY_INLINE void PrefetchBytes(const void* p, int64_t bytes) {
  if (p == nullptr) return;
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) hwy::Prefetch(c + o);
}

// Row r of t (rank >= 1, last dim n); RowOf(weight, 0, n, buf) makes a rank-1 weight contiguous.
template <typename T>
const T* RowOf(const TensorView& t, int64_t r, int64_t n, std::vector<T>& buf) {
  return RowOf(t.data_as<const T>(), t.shape, t.strides, r, n, buf);
}

// Kernels that also sum over rows (grad_weight, grad_bias) cut the rows into chunks whose
// number depends on the shape only, never on the thread count; each chunk sums into its own
// partial, and SumChunks adds the partials in chunk order, so the result is bitwise the same
// whatever the thread count. Chunk k holds rows [rows * k / chunks, rows * (k + 1) / chunks).
inline constexpr int64_t kChunkWork = 1 << 15;  // elements per chunk, roughly
inline constexpr int64_t kMaxChunks = 64;

// The chunk count for rows >= 1 rows of n elements: at most rows / 8, so the partials stay a
// small fraction of the input.
HWY_INLINE int64_t RowChunks(int64_t rows, int64_t n) {
  const int64_t want = (rows * n + kChunkWork - 1) / kChunkWork;
  return std::clamp<int64_t>(want, 1, std::min<int64_t>(kMaxChunks, std::max<int64_t>(1, rows / 8)));
}

// out[i] = sum over k of partial[k * n + i], in chunk order.
template <typename T>
void SumChunks(T* HWY_RESTRICT out, const Compute<T>* HWY_RESTRICT partial, int64_t chunks, int64_t n) {
  using C = Compute<T>;
  const hn::ScalableTag<C> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    auto sum = hn::LoadU(d, partial + i);
    for (int64_t k = 1; k < chunks; ++k) sum = hn::Add(sum, hn::LoadU(d, partial + k * n + i));
    StoreAs(d, sum, out + i);
  }
  for (; i < n; ++i) {
    C sum = partial[i];
    for (int64_t k = 1; k < chunks; ++k) sum += partial[k * n + i];
    out[i] = FromCompute<T>(sum);
  }
}

}  // namespace opforge::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_CPU_ROWS_INL_H_
