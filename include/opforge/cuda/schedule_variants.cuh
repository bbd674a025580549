// The schedules bench/schedules_cuda.cu times beside the ops' own (cuda::PlainAccess, CachedRow):
// other loads and stores for CachedRow and map_contiguous, a row staged in shared memory and a
// row reread from the caches on every pass. No op uses them; an op adopts one (its OwnRow,
// MapSchedule's defaults) once it is measured faster, and it then moves beside PlainAccess and
// CachedRow.
#pragma once

#include <cstring>

#include "opforge/cuda/async_copy.cuh"
#include "opforge/cuda/rows.cuh"

namespace opforge::cuda {

// Plain loads and stores, each store a barrier to the compiler's reordering (asm volatile with a
// "memory" clobber): the loads after it (a row kernel's next weights) are not hoisted above it, so
// fewer values are live at once. StreamingAccess's stores are such barriers too; this is that
// register count without its cache hint (ptxas, sm_90: float32 layer_norm 52 registers plain,
// 39 streaming), so the two effects can be timed apart.
struct OrderedAccess {
  template <class P> __device__ __forceinline__ static P load(const P* p) { return *p; }
  template <class P> __device__ __forceinline__ static void store(P* p, const P& v) {
    static_assert(sizeof(P) == 16);
#ifndef CUDA_EMU_ARCH
    unsigned w[4];
    memcpy(w, &v, sizeof(w));
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                 : "memory");
#else
    *p = v;
#endif
  }
};
struct StreamingAccess {
  template <class P> __device__ __forceinline__ static P load(const P* p) {
    static_assert(sizeof(P) == sizeof(int4));
    const int4 bits = __ldcs(reinterpret_cast<const int4*>(p));
    P v;
    memcpy(&v, &bits, sizeof(v));
    return v;
  }
  template <class P> __device__ __forceinline__ static void store(P* p, const P& v) {
    int4 bits;
    memcpy(&bits, &v, sizeof(bits));
    __stcs(reinterpret_cast<int4*>(p), bits);
  }
};

// A contiguous, 16-byte aligned row of n elements (a whole number of packs, at most kStagedPacks)
// copied into shared memory by cp.async and read from there by every pass: the bytes in flight
// are held by the copies, not by registers as CachedRow's are, so an SM holds as many rows as its
// shared memory does (13 rows of 16 KB on sm_90, blocks of 128 threads) rather than as its
// registers do. One of the schedules bench/schedules_cuda.cu times against the ops' CachedRow; each
// thread copies kPacks packs (threadIdx.x + k * blockDim.x), and each pass reads the same ones
// (and no others).
inline constexpr int kStagedPacks = 1024;  // 16 KB

template <typename T, int kPacks>
struct StagedRow {
  using Element = T;
  using P = Pack<T>;
  static constexpr int kThreadPacks = kPacks;
  static constexpr int64_t kMaxPacks = kStagedPacks;
  const P* packs;
  int64_t count;  // packs in the row

  __device__ StagedRow(const T* row, int64_t n) : count(n / P::kSize) {
    __shared__ __align__(16) P staged[kStagedPacks];
    // Every pass reads only the packs this thread copied: its own copies' wait is enough, no
    // barrier (nor one before the next row's copies overwrite this one's).
    for_row_packs<kPacks>(count, [&](int, int64_t j) { copy16_async(staged + j, reinterpret_cast<const P*>(row) + j); });
    wait_async_copies();
    packs = staged;
  }
  template <class F> __device__ void each(F f) const {
    for_row_packs<kPacks>(count, [&](int, int64_t j) {
      const P v = packs[j];
#pragma unroll
      for (int e = 0; e < P::kSize; ++e) f(j * P::kSize + e, static_cast<Acc<T>>(v.v[e]));
    });
  }
  // out[i] = f(x[i], c) with c[q] = column operand q at i, the operands read in packs.
  template <int E, class F> __device__ void store(T* out, const Columns<T, E>& cols, F f) const {
    for_row_packs<kPacks>(count, [&](int, int64_t j) { store_with_columns<PlainAccess>(out, j, packs[j], cols, f); });
  }
};

// A 16-byte load whose lines L1 and L2 evict after others (kLast) or before them (!kLast): the
// eviction_policy='evict_last' / 'evict_first' of a Triton load, lowered as Triton lowers it on
// sm_80 and later (an L1 eviction priority, and an L2 cache policy from createpolicy). kFenced:
// volatile, with a memory clobber, so that it stays in program order with every other load and
// store of the kernel (the first variants' way: out may be x); that also keeps the compiler from
// issuing a thread's next load before its previous store, so each thread has one load in flight
// at a time where loads and stores alternate. Unfenced, as Triton's loads are: the compiler may
// move it, but never past the store of the value it feeds, so a row normalized in place (each
// thread stores only elements it has loaded) stays right.
template <bool kLast, bool kFenced = true, class P>
__device__ __forceinline__ P load_with_eviction(const P* p) {
  static_assert(sizeof(P) == 16);
#ifndef CUDA_EMU_ARCH
  unsigned w[4];
  unsigned long long policy;
  if constexpr (kLast) asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  else asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  if constexpr (kLast && kFenced)
    asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.b32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p), "l"(policy) : "memory");
  else if constexpr (kFenced)
    asm volatile("ld.global.L1::evict_first.L2::cache_hint.v4.b32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p), "l"(policy) : "memory");
  else if constexpr (kLast)
    asm("ld.global.L1::evict_last.L2::cache_hint.v4.b32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p), "l"(policy));
  else
    asm("ld.global.L1::evict_first.L2::cache_hint.v4.b32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p), "l"(policy));
  P v;
  memcpy(&v, w, sizeof(v));
  return v;
#else
  return *p;
#endif
}

// CachedRow whose store pass loads every one of the thread's column-operand packs (the norms'
// weight and bias) before its first store. CachedRow's own pass alternates them (load pack 0's
// weight, store pack 0, load pack 1's weight, ...: in PTX the compiler may not move a load above
// a store that could alias it), so after the row's reduction a thread waits one L1 round trip
// per pack; here it waits one in all, for kPacks * E packs more in registers at that point.
template <typename T, int kPacks = kRowPacks>
struct ColumnsFirstRow : CachedRow<T, kPacks, PlainAccess> {
  using Base = CachedRow<T, kPacks, PlainAccess>;
  using typename Base::P;
  using Base::Base;
  using Base::store;

  template <int E, class F> __device__ void store(T* out, const Columns<T, E>& cols, F f) const {
    P c[kPacks][E];
    this->for_packs([&](int k, int64_t j) {
#pragma unroll
      for (int q = 0; q < E; ++q) c[k][q] = reinterpret_cast<const P*>(cols.p[q])[j];
    });
    this->for_packs([&](int k, int64_t j) {
      P o;
#pragma unroll
      for (int e = 0; e < P::kSize; ++e) {
        Acc<T> a[E];
#pragma unroll
        for (int q = 0; q < E; ++q) a[q] = static_cast<Acc<T>>(c[k][q].v[e]);
        o.v[e] = static_cast<T>(f(static_cast<Acc<T>>(this->packs[k].v[e]), a));
      }
      reinterpret_cast<P*>(out)[j] = o;
    });
  }
};

// A contiguous, 16-byte aligned row of n elements (a whole number of packs) read from global
// memory again on every pass, as inductor's looped reductions read theirs (the norms at 4096
// columns: a sum pass, then a pass that reloads and stores): only the first pass's bytes come from
// HBM, the later ones mostly from L1 and L2. A thread holds kGroup packs at a time, not the whole
// row's kPacks as CachedRow does, so it needs fewer registers and an SM holds more rows. Each
// thread walks CachedRow's packs (threadIdx.x + k * blockDim.x, k = 0..kPacks-1) in CachedRow's
// order, kGroup loads issued before the first is used: the same sums, the same bits. With kHinted,
// each() loads evict-last (the row is read again) and the store pass evict-first (its last read),
// as inductor's kernels ask, fenced or not (load_with_eviction); without, plain loads, to time
// the hints apart. Nsight Compute on the
// H200 (bench/results/ncu_kernels.csv) has inductor's float32 norms at 4096 columns in 512-thread
// blocks, a row each, 24-32 registers, x read twice: RereadRow<float, 2, 1> at 512 threads, which
// this lab timed at 0.84x (rms_norm) and 0.65x (layer_norm) the ops' own, while inductor's own
// kernels ran 1.025x and 1.04x them: how the same schedule ends up that much faster in Triton's
// code is the open question.
template <typename T, int kPacks, int kGroup = 1, bool kHinted = true, bool kFenced = true>
struct RereadRow {
  static_assert(kPacks % kGroup == 0);
  using Element = T;
  using P = Pack<T>;
  static constexpr int kThreadPacks = kPacks;
  static constexpr int64_t kMaxPacks = int64_t(kPacks) * kMaxRowThreads;
  const P* row;
  int64_t count;  // packs in the row

  __device__ RereadRow(const T* x, int64_t n) : row(reinterpret_cast<const P*>(x)), count(n / P::kSize) {}

  template <class F> __device__ void each(F f) const {
    in_groups<true>([&](int64_t j, const P& v) {
#pragma unroll
      for (int e = 0; e < P::kSize; ++e) f(j * P::kSize + e, static_cast<Acc<T>>(v.v[e]));
    });
  }
  // out[i] = f(x[i], c) with c[q] = column operand q at i, the operands read in packs.
  template <int E, class F> __device__ void store(T* out, const Columns<T, E>& cols, F f) const {
    in_groups<false>([&](int64_t j, const P& v) { store_with_columns<PlainAccess>(out, j, v, cols, f); });
  }

 private:
  // body(j, pack j) for this thread's packs in order, kGroup loaded at a time (evict-last loads if
  // kAgain: the row is read again). Unfenced, a row the block's threads cover exactly (the norms'
  // 4096 columns) skips the per-pack bounds tests, as Triton's unmasked loads do: its loads are
  // then free to move ahead of the previous pack's work.
  template <bool kAgain, class B> __device__ __forceinline__ void in_groups(B body) const {
    if constexpr (!kFenced) {
      if (count == int64_t(kPacks) * blockDim.x) return in_groups_checked<kAgain, false>(body);
    }
    in_groups_checked<kAgain, true>(body);
  }
  template <bool kAgain, bool kChecked, class B> __device__ __forceinline__ void in_groups_checked(B body) const {
#pragma unroll
    for (int g = 0; g < kPacks; g += kGroup) {
      P v[kGroup];
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {
        const int64_t j = threadIdx.x + int64_t(g + k) * blockDim.x;
        if (!kChecked || j < count) {
          if constexpr (kHinted) v[k] = load_with_eviction<kAgain, kFenced>(row + j);
          else v[k] = row[j];
        }
      }
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {
        const int64_t j = threadIdx.x + int64_t(g + k) * blockDim.x;
        if (!kChecked || j < count) body(j, v[k]);
      }
    }
  }
};

}  // namespace opforge::cuda
