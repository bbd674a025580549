// The schedules bench/schedules_cuda.cu times beside the ops' own (cuda::PlainAccess, CachedRow):
// other loads and stores for CachedRow and map_contiguous, and a row staged in shared memory.
// No op uses them; an op adopts one (its OwnAccess, MapSchedule's defaults) once it is measured
// faster, and it then moves beside PlainAccess.
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
  using P = Pack<T>;
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

}  // namespace opforge::cuda
