// scatter_add on the CPU. Every output element is the sum of its bucket's source elements in
// increasing i, accumulated in float32/float64 from +0 and stored once. Two ways to get there,
// bit-identical (each lane is its own sum, only adds, same order), so the choice between them
// and the thread count never change the result:
//   stream:  a task owns an output block out[o, :, k-chunk] and walks src in order, adding each
//            slice into its bucket's accumulator row. Reads src sequentially; wins whenever the
//            accumulator block fits in L2 or the slices are shorter than a cache line.
//   buckets: a stable counting sort lists each bucket's i in order; a task owns out[o, j, k-chunk]
//            and gathers its bucket's slices (prefetched). For many buckets of long slices,
//            where a stream task's accumulator would spill out of the caches.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/scatter_add/scatter_add_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "opforge/cpu/simd-inl.h"
#include "opforge/cpu/visit.h"
#include "opforge/registry.h"
#include "ops/scatter_add/scatter_layout.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::scatter_add_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;

constexpr int64_t kL2Bytes = 1 << 20;  // accumulator budget per stream task
constexpr int64_t kChunk = 2048;       // output elements per bucket task at most (stays in L1)

template <typename T>
HWY_INLINE void AddRow(Compute<T>* HWY_RESTRICT acc, const T* HWY_RESTRICT row, int64_t len) {
  const hn::ScalableTag<Compute<T>> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t k = 0;
  for (; k + lanes <= len; k += lanes) hn::StoreU(hn::Add(hn::LoadU(d, acc + k), LoadAs(d, row + k)), d, acc + k);
  for (; k < len; ++k) acc[k] += ToCompute(row[k]);
}

// Asks for the line at p into L2, not L1: L1 holds the accumulator rows, and prefetches into it
// evict them (measured: 16 buckets x 512 columns, 2 threads, 22 GB/s into L1, 33 GB/s into L2).
HWY_INLINE void PrefetchToL2(const void* p) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 0, 2);  // prefetcht1 on x86, PLDL2KEEP on Arm
#else
  hwy::Prefetch(p);
#endif
}

// AddRow, also asking L2 for the same columns of a later slice (ahead, or nullptr): each thread
// reads its column band of src row by row, short runs that leave the hardware prefetcher (which
// follows demand misses a few lines ahead) behind at every jump to the next row.
template <typename T>
HWY_INLINE void AddRowPrefetching(Compute<T>* HWY_RESTRICT acc, const T* HWY_RESTRICT row, int64_t len,
                                  const T* ahead) {
  constexpr int64_t kLine = 64 / sizeof(T);
  int64_t k = 0;
  if (ahead)
    for (; k + kLine <= len; k += kLine) {
      PrefetchToL2(ahead + k);
      AddRow(acc + k, row + k, kLine);
    }
  AddRow(acc + k, row + k, len - k);
}

template <typename T>
HWY_INLINE void StoreRow(T* HWY_RESTRICT out, const Compute<T>* HWY_RESTRICT acc, int64_t len) {
  const hn::ScalableTag<Compute<T>> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t k = 0;
  for (; k + lanes <= len; k += lanes) StoreAs(d, hn::LoadU(d, acc + k), out + k);
  for (; k < len; ++k) out[k] = FromCompute<T>(acc[k]);
}

template <typename T>
void Stream(T* dst, const T* data, const scatter::Slices& s, const scatter::IndexView& index, int64_t dim_size) {
  using C = Compute<T>;
  const int64_t inner = s.inner, n = s.n;
  int64_t len = std::min(inner, std::max<int64_t>(16, kL2Bytes / static_cast<int64_t>(sizeof(C)) / dim_size));
  // Feed the pool from inner chunks when there are few outer blocks (any split gives the same
  // bits), down to 128-byte pieces of each slice: the pairs of lines x86 prefetchers fetch.
  constexpr int64_t kPiece = 128 / sizeof(T);
  while (s.outer * ((inner + len - 1) / len) < num_threads() && len >= 2 * kPiece)
    len = (len / 2 + kPiece - 1) / kPiece * kPiece;
  const int64_t chunks = (inner + len - 1) / len;
  parallel_for(s.outer * chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<C> buffer;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o = t / chunks, k0 = (t % chunks) * len, l = std::min(len, inner - k0);
      const T* src = data + s.base(o) + k0;
      C* acc = nullptr;
      bool in_place = false;  // out's own rows are the accumulator
      if constexpr (std::is_same_v<T, C>) {
        in_place = l == inner;
        if (in_place) acc = dst + o * dim_size * inner;
      }
      if (!in_place) {
        buffer.resize(dim_size * l);
        acc = buffer.data();
      }
      std::fill(acc, acc + dim_size * l, C(0));
      if (l == 1) {
        for (int64_t i = 0; i < n; ++i) acc[index[i]] += ToCompute(src[i * s.step]);
      } else if (l == s.step) {  // the slices are back to back: one sequential read, prefetched by hardware
        for (int64_t i = 0; i < n; ++i) AddRow(acc + index[i] * l, src + i * l, l);
      } else {
        constexpr int64_t kAhead = 16;  // slices: enough bytes in flight to cover memory latency
        for (int64_t i = 0; i < n; ++i)
          AddRowPrefetching(acc + index[i] * l, src + i * s.step, l, i + kAhead < n ? src + (i + kAhead) * s.step : nullptr);
      }
      if (!in_place)
        for (int64_t j = 0; j < dim_size; ++j) StoreRow(dst + (o * dim_size + j) * inner + k0, acc + j * l, l);
    }
  });
}

template <typename T>
void Buckets(T* dst, const T* data, const scatter::Slices& s, const scatter::IndexView& index, int64_t dim_size) {
  using C = Compute<T>;
  // Bucket j's source positions are order[start[j] .. start[j + 1]), increasing.
  const int64_t n = s.n;
  std::vector<int64_t> start(dim_size + 1, 0), order(n);
  for (int64_t i = 0; i < n; ++i) ++start[index[i] + 1];
  for (int64_t j = 0; j < dim_size; ++j) start[j + 1] += start[j];
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[next[index[i]]++] = i;
  }
  const int64_t inner = s.inner, chunks = (inner + kChunk - 1) / kChunk;
  const int64_t work = (n / dim_size + 1) * std::min(inner, kChunk);
  constexpr int64_t kAhead = 8;  // slices prefetched ahead: their rows are scattered in memory
  parallel_for(s.outer * dim_size * chunks, std::max<int64_t>(1, (1 << 15) / work), [&](int64_t begin, int64_t end) {
    std::vector<C> acc(std::min(inner, kChunk));
    for (int64_t t = begin; t < end; ++t) {
      const int64_t c = t % chunks, j = (t / chunks) % dim_size, o = t / (chunks * dim_size);
      const int64_t k0 = c * kChunk, len = std::min(kChunk, inner - k0);
      const T* src = data + s.base(o) + k0;
      std::fill(acc.begin(), acc.begin() + len, C(0));
      for (int64_t p = start[j]; p < start[j + 1]; ++p) {
        if (p + kAhead < start[j + 1]) {
          const T* ahead = src + order[p + kAhead] * s.step;
          for (int64_t k = 0; k < std::min<int64_t>(len, 256 / sizeof(T)); k += 64 / sizeof(T)) hwy::Prefetch(ahead + k);
        }
        AddRow(acc.data(), src + order[p] * s.step, len);
      }
      StoreRow(dst + (o * dim_size + j) * inner + k0, acc.data(), len);
    }
  });
}

void Run(const KernelCall& call) {
  const TensorView& src = call.tensor("src");
  const TensorView& out = call.output();
  const int64_t dim = scatter::checked_dim(call, "src");
  const int64_t dim_size = call.attr_int("dim_size");
  const scatter::IndexView index = scatter::checked_index(call, dim_size, "dim_size");
  if (out.numel() == 0) return;  // called for the check alone (OpDef::validates)
  cpu::visit_float(src.dtype, "scatter_add", [&](auto tag) {
    using T = decltype(tag);
    scatter::Slices s = scatter::slices_of(src, dim);
    const T* data = src.data_as<const T>();
    std::vector<T> copy;
    if (!s.inner_contiguous) {
      copy = scatter::contiguous_copy<T>(src);
      TensorView view = src;
      view.data = copy.data();
      view.strides = contiguous_strides(src.shape);
      s = scatter::slices_of(view, dim);
      data = copy.data();
    }
    const bool stream = s.inner < 16 || dim_size * 16 * static_cast<int64_t>(sizeof(Compute<T>)) <= kL2Bytes;
    if (stream) Stream(out.data_as<T>(), data, s, index, dim_size);
    else Buckets(out.data_as<T>(), data, s, index, dim_size);
  });
}

}  // namespace opforge::scatter_add_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::scatter_add_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(scatter_add, "cpu", float_dtypes(), run);
}  // namespace opforge::scatter_add_cpu
#endif
