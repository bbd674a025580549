// Row kernels over rows that sit side by side in memory (x.T's, softmax over a leading
// dimension moved last): row r + 1 starts one element after row r and a row's elements lie
// `step` apart. Read as StridedRow, with one block per row, every warp load touches 32 sectors
// for 32 elements. Here a block takes a panel of rows instead, one warp per row, as many rows as
// fill a 32-byte sector of each column (8 float32, 16 half, 4 float64): the block loads the
// panel's columns a sector at a time, all its threads together, and transposes them through a
// shared-memory tile, so that lane l of warp w sees columns l, l + 32, ... of row w and stores
// its results in contiguous runs. A row's reductions are the warp's (row_reduce and friends
// below), so the kernel bodies of rows.cuh run unchanged, one row per warp. Each pass over the
// row (each, store) reads the panel again, as StridedRow does; rereads of recent panels come from
// L2.
#pragma once

#include "opforge/cuda/rows.cuh"

namespace opforge::cuda {

// A kernel body's reductions over its row, the same value in every thread of the row: for a
// block per row (CachedRow, StridedRow, the schedule variants) the block's, for PanelRow the
// warp's. Kernel bodies call these, not block_reduce, so that they run on either.
template <class Row, typename A, class Op>
__device__ __forceinline__ A row_reduce(const Row&, A v, Op op) { return block_reduce(v, op); }
template <class Row, typename A>
__device__ __forceinline__ A row_sum(const Row&, A v) { return block_sum(v); }
template <class Row, typename A>
__device__ __forceinline__ void row_sum2(const Row&, A& a, A& b) { block_sum2(a, b); }
template <class Row>
__device__ __forceinline__ bool row_any(const Row&, bool p) { return __syncthreads_or(p) != 0; }

template <typename T>
struct PanelRow {
  static constexpr int kRows = 32 / int(sizeof(T));
  static constexpr int kThreads = 32 * kRows;  // the block: one warp per row
  static constexpr int kLoads = 8;             // loads per thread per chunk, in flight together
  static constexpr int kChunk = 32 * kLoads;   // columns per chunk

  const T* panel;  // row i of the panel, column c at panel[i + c * step]
  int64_t step, n;
  int rows;  // rows of the panel that exist (the last panel of a run may be short)

  template <class F> __device__ void each(F f) const {
    chunks([&](int64_t c, Acc<T> v) { f(c, v); });
  }
  // out[i] = f(i, x[i]), out this warp's row of a contiguous result.
  template <class F> __device__ void store(T* out, F f) const {
    const bool mine = threadIdx.x / 32 < rows;
    chunks([&](int64_t c, Acc<T> v) {
      if (mine) cuda::store(out + c, f(c, v));
    });
  }
  // out[i] = f(x[i], c) with c[q] = column operand q at i.
  template <int E, class F> __device__ void store(T* out, const Columns<T, E>& cols, F f) const {
    const bool mine = threadIdx.x / 32 < rows;
    chunks([&](int64_t i, Acc<T> v) {
      if (!mine) return;
      Acc<T> c[E];
#pragma unroll
      for (int q = 0; q < E; ++q) c[q] = load(cols.p[q] + i * cols.step[q]);
      cuda::store(out + i, f(v, c));
    });
  }

 private:
  using Tile = Acc<T>[kChunk][kRows + 1];  // [column][row]; the odd pitch spreads the banks
  // One tile per element type, whatever passes a kernel makes (a __shared__ array in chunks()
  // would be one per instantiation, one per pass: 69 KiB for layer_norm's half types).
  static __device__ __forceinline__ Tile& shared_tile() {
    __shared__ Tile tile;
    return tile;
  }

  // body(c, x[c]) for this warp's row, lane l taking columns l, l + 32, ... of each chunk (every
  // thread of the block calls this: the loads and barriers are the block's; a warp past the
  // panel's rows gets zeros).
  template <class B> __device__ __forceinline__ void chunks(B body) const {
    auto& tile = shared_tile();
    const int row = threadIdx.x % kRows, column = threadIdx.x / kRows;  // this thread's loads
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;            // its row and columns
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
#pragma unroll
      for (int k = 0; k < kLoads; ++k) {
        const int64_t c = c0 + column + 32 * k;
        tile[column + 32 * k][row] = row < rows && c < n ? load(panel + row + c * step) : Acc<T>(0);
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kLoads; ++k) {
        const int64_t c = c0 + lane + 32 * k;
        if (c < n) body(c, tile[lane + 32 * k][w]);
      }
      __syncthreads();  // the tile's reads are done before the next chunk's loads
    }
  }
};

// v reduced over the warp with op, the same value in every lane.
template <typename A, class Op>
__device__ __forceinline__ A warp_reduce_all(A v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename T, typename A, class Op>
__device__ __forceinline__ A row_reduce(const PanelRow<T>&, A v, Op op) { return warp_reduce_all(v, op); }
template <typename T, typename A>
__device__ __forceinline__ A row_sum(const PanelRow<T>&, A v) { return warp_reduce_all(v, Sum{}); }
template <typename T, typename A>
__device__ __forceinline__ void row_sum2(const PanelRow<T>&, A& a, A& b) {
  a = warp_reduce_all(a, Sum{});
  b = warp_reduce_all(b, Sum{});
}
template <typename T>
__device__ __forceinline__ bool row_any(const PanelRow<T>&, bool p) { return __any_sync(0xffffffffu, p) != 0; }

// Where a row kernel's x has rows side by side (dimension -2 of stride 1, the last dimension
// not): its panels, each of PanelRow<T>::kRows rows of one run of dimension -2 (the last panel of
// a run shorter). Panel p's first row is the (linear) row `first`, `rows` of them.
struct Panels {
  int64_t run;         // rows in a run: x.size(-2)
  int64_t per_run;     // panels in a run
  int64_t count;       // panels in all
  int panel_rows;      // PanelRow<T>::kRows

  __host__ __device__ int64_t first(int64_t p) const { return p / per_run * run + p % per_run * panel_rows; }
  __host__ __device__ int rows(int64_t p) const {
    const int64_t left = run - p % per_run * panel_rows;
    return left < panel_rows ? static_cast<int>(left) : panel_rows;
  }
};

// The panels of x's rows for PanelRow<T>, or count 0 where its rows do not sit side by side.
template <typename T>
Panels side_by_side_panels(const TensorView& x) {
  Panels p{0, 0, 0, PanelRow<T>::kRows};
  if (x.rank() < 2 || x.stride(-2) != 1 || x.stride(-1) == 1 || x.size(-1) < 2 || x.size(-2) < 2) return p;
  p.run = x.size(-2);
  p.per_run = (p.run + p.panel_rows - 1) / p.panel_rows;
  p.count = x.numel() / x.size(-1) / p.run * p.per_run;
  return p;
}

}  // namespace opforge::cuda
