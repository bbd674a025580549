// Walking strided and broadcast operands row by row. Ops that work elementwise hand this
// their operands' strides; it coalesces dimensions so the common cases (contiguous,
// scalar-broadcast) become one long row that SIMD code takes whole.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "opforge/parallel.h"
#include "opforge/tensor.h"

namespace opforge::cpu {

// Element offset of linear index `linear` (row-major over `shape`) given `strides`.
inline int64_t offset_of(int64_t linear, const int64_t* shape, const int64_t* strides, int64_t rank) {
  int64_t offset = 0;
  for (int64_t d = rank - 1; d >= 0 && linear; --d) {
    offset += (linear % shape[d]) * strides[d];
    linear /= shape[d];
  }
  return offset;
}

// A row: `len` elements; operand k starts at offsets[k] and steps by inner[k].
// Operand 0 is the contiguous output.
template <size_t N>
struct Row {
  std::array<int64_t, N> offsets;
  std::array<int64_t, N> inner;
  int64_t len;
};

// A block of `count` rows of `len` elements each: element j of row c of operand k is at
// offsets[k] + c * outer[k] + j * inner[k]. A walker's callback that takes it (for_each_row) gets
// a two-dimensional walk's whole rows as one block and every other row as a block of one. The
// callbacks are compiled for a SIMD target the walker is not (Highway's per-target code), so they
// cannot be inlined into the walker: one call per block instead of one per row.
template <size_t N>
struct Rows {
  std::array<int64_t, N> offsets, inner, outer;
  int64_t len, count;
  // Where row c of operand k starts.
  int64_t at(size_t k, int64_t c) const { return offsets[k] + c * outer[k]; }
};

// Operands ks[0], ks[1], .. of block r, as a block of its own (one output's share of a walk
// over several outputs).
template <size_t M, size_t N>
Rows<M> pick_operands(const Rows<N>& r, const std::array<size_t, M>& ks) {
  Rows<M> b;
  b.len = r.len;
  b.count = r.count;
  for (size_t i = 0; i < M; ++i) {
    b.offsets[i] = r.offsets[ks[i]];
    b.inner[i] = r.inner[ks[i]];
    b.outer[i] = r.outer[ks[i]];
  }
  return b;
}

// fn(r), or fn of a block of the one row where fn takes blocks (Rows).
template <size_t N, typename F>
inline void emit_row(F& fn, const Row<N>& r) {
  if constexpr (std::is_invocable_v<F&, const Rows<N>&>) {
    const Rows<N> b{r.offsets, r.inner, {}, r.len, 1};
    fn(b);
  } else {
    fn(r);
  }
}

// Rows of a tile in walk_in_tiles: a block of kTileRows rows, kTileCols columns at a time. A
// transposed input is read in runs of kTileRows elements (512 bytes of float32) from each of
// kTileCols rows of its own; the other operands in runs of kTileCols from each of kTileRows
// rows. Square tiles of 512-byte runs, measured on 4096 x 4096 float32 x.T + y (inputs from
// memory, AMD EPYC VM, one thread; contiguous x + y 4.7 ms): 16 x 32 tiles 23.7 ms, 64 x 64 16.6,
// 128 x 128 15.2, 256 x 64 15.0, 1024 x 32 23.6. Scattered short runs cost more than the
// lines they load (DRAM pages, TLB walks): torch's own transposed copy there is 4.75x its copy.
inline constexpr int64_t kTileRows = 128, kTileCols = 128;

// Whether some input (k >= 1) steps through memory faster along the second-innermost dimension
// than along the innermost (a transposed view: x.T + 1): walked row by row it would be read one
// cache line, and one page, per element.
template <size_t N>
bool needs_tiles(const std::array<Dims, N>& st, size_t rank) {
  if (rank < 2) return false;
  for (size_t k = 1; k < N; ++k) {
    const int64_t in = std::abs(st[k][rank - 1]), out = std::abs(st[k][rank - 2]);
    if (in >= 4 && out < in) return true;
  }
  return false;
}

// The walk for needs_tiles: blocks of kTileRows rows of the second-innermost dimension, each
// walked kTileCols columns at a time across its rows, so each line the transposed input loads
// serves kTileRows rows (2048 x 2048 float32, x.T + x.T: 11-15 ms row by row, 4-5 ms so, on a
// 2-core Xeon). A callback that takes blocks (Rows) gets each tile as one, which it may read in
// squares (transpose-inl.h's MapSquares). Blocks go to threads, at least `grain` elements each.
template <size_t N, typename F>
void walk_in_tiles(const Dims& dims, const std::array<Dims, N>& st, int64_t total, int64_t grain, F& fn) {
  const size_t rank = dims.size();
  const int64_t inner = dims[rank - 1], rows = dims[rank - 2];
  const int64_t blocks = (rows + kTileRows - 1) / kTileRows, groups = total / (inner * rows) * blocks;
  const auto run = [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t outer = g / blocks, j0 = g % blocks * kTileRows, j1 = std::min(rows, j0 + kTileRows);
      std::array<int64_t, N> base;
      for (size_t k = 0; k < N; ++k)
        base[k] = offset_of(outer, dims.data(), st[k].data(), static_cast<int64_t>(rank) - 2);
      for (int64_t c0 = 0; c0 < inner; c0 += kTileCols) {
        if constexpr (std::is_invocable_v<F&, const Rows<N>&>) {  // the tile as one block
          Rows<N> b;
          b.len = std::min(kTileCols, inner - c0);
          b.count = j1 - j0;
          for (size_t k = 0; k < N; ++k) {
            b.inner[k] = st[k][rank - 1];
            b.outer[k] = st[k][rank - 2];
            b.offsets[k] = base[k] + j0 * b.outer[k] + c0 * b.inner[k];
          }
          fn(b);
          continue;
        }
        for (int64_t j = j0; j < j1; ++j) {
          Row<N> r;
          r.len = std::min(kTileCols, inner - c0);
          for (size_t k = 0; k < N; ++k) {
            r.inner[k] = st[k][rank - 1];
            r.offsets[k] = base[k] + j * st[k][rank - 2] + c0 * r.inner[k];
          }
          emit_row<N>(fn, r);
        }
      }
    }
  };
  if (total <= grain) run(0, groups);
  else parallel_for(groups, std::max<int64_t>(1, grain / (kTileRows * inner)), run);
}

// The rows of elements [begin, end) of a two-dimensional walk (one outer dimension after
// merging: the common case of short rows, a [rows, 64] tensor times a [64] bias, channels-last
// by a per-channel scale), the strides held in locals: the general walk reads them from
// Dims on every row, and reloads them after each row's stores wherever those could alias
// them (one thread, row by row: [65536, 64] * [64] 0.67 -> 0.59 ms, [262144, 16] + [16] 1.65 ->
// 1.10). A callback that takes blocks (Rows) gets the chunk's whole rows as one.
template <size_t N, typename F>
void walk_rows_2d(int64_t begin, int64_t end, int64_t inner, const std::array<Dims, N>& st, F& fn) {
  std::array<int64_t, N> outer, step, start;
  for (size_t k = 0; k < N; ++k) {
    outer[k] = st[k][0];
    step[k] = st[k][1];
  }
  int64_t row = begin / inner, col = begin % inner;
  for (size_t k = 0; k < N; ++k) start[k] = row * outer[k];
  if constexpr (std::is_invocable_v<F&, const Rows<N>&>) {
    // The chunk's partial first row, its whole rows, its partial last row.
    for (int64_t pos = begin; pos < end;) {
      Rows<N> b;
      b.len = std::min(inner - col, end - pos);
      b.count = col == 0 && b.len == inner ? (end - pos) / inner : 1;
      for (size_t k = 0; k < N; ++k) {
        b.inner[k] = step[k];
        b.outer[k] = outer[k];
        b.offsets[k] = start[k] + col * step[k];
        start[k] += b.count * outer[k];
      }
      fn(b);
      pos += b.len * b.count;
      col = 0;
    }
  } else {
    for (int64_t pos = begin; pos < end;) {
      Row<N> r;
      r.len = std::min(inner - col, end - pos);
      for (size_t k = 0; k < N; ++k) {
        r.inner[k] = step[k];
        r.offsets[k] = start[k] + col * step[k];
        start[k] += outer[k];
      }
      fn(r);
      pos += r.len;
      col = 0;
    }
  }
}

// Calls fn(Row), or fn(Rows) where fn takes blocks of rows, over the whole iteration space of
// `shape`, in parallel chunks of at least `grain` elements, each element once; strides[k] are
// operand k's strides (already broadcast). The rows come in no particular order (in tiles where
// an input is transposed): fn writes each element of its output on its own, as every
// elementwise caller does.
template <size_t N, typename F>
void for_each_row(const Dims& shape, const std::array<Dims, N>& strides,
                  int64_t grain, F&& fn) {
  // Drop size-1 dimensions, then merge neighbours every operand steps through evenly.
  Dims dims;
  std::array<Dims, N> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !dims.empty();
    for (size_t k = 0; k < N && merge; ++k) merge = st[k].back() == strides[k][d] * shape[d];
    if (merge) {
      dims.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) st[k].back() = strides[k][d];
    } else {
      dims.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) st[k].push_back(strides[k][d]);
    }
  }
  if (dims.empty()) {
    dims.push_back(1);
    for (size_t k = 0; k < N; ++k) st[k].push_back(0);
  }
  const int64_t rank = static_cast<int64_t>(dims.size());
  const int64_t inner = dims.back();
  int64_t total = 1;
  for (size_t d = 0; d < dims.size(); ++d) total *= dims[d];
  if (total == 0) return;
  if (needs_tiles<N>(st, dims.size())) return walk_in_tiles<N>(dims, st, total, grain, fn);
  const auto chunk = [&](int64_t begin, int64_t end) {
    if (rank == 2) return walk_rows_2d<N>(begin, end, inner, st, fn);
    // The chunk's first row is found by division; later rows by stepping an odometer over the
    // outer dimensions. Divisions per row (one per operand) cost as much as a short row's work.
    int64_t row = begin / inner, col = begin % inner;
    Dims index;
    for (int64_t d = 0; d < rank - 1; ++d) index.push_back(0);
    for (int64_t d = rank - 2, rest = row; d >= 0; --d) {
      index[d] = rest % dims[d];
      rest /= dims[d];
    }
    std::array<int64_t, N> start;
    for (size_t k = 0; k < N; ++k) start[k] = offset_of(row, dims.data(), st[k].data(), rank - 1);
    for (int64_t pos = begin; pos < end;) {
      Row<N> r;
      r.len = std::min(inner - col, end - pos);
      for (size_t k = 0; k < N; ++k) {
        r.inner[k] = st[k].back();
        r.offsets[k] = start[k] + col * r.inner[k];
      }
      emit_row<N>(fn, r);
      pos += r.len;
      col = 0;
      for (int64_t d = rank - 2; d >= 0; --d) {
        for (size_t k = 0; k < N; ++k) start[k] += st[k][d];
        if (++index[d] < dims[d]) break;
        for (size_t k = 0; k < N; ++k) start[k] -= st[k][d] * dims[d];
        index[d] = 0;
      }
    }
  };
  // One chunk runs here, without wrapping the body in parallel_for's std::function.
  if (total <= grain) chunk(0, total);
  else parallel_for(total, grain, chunk);
}

}  // namespace opforge::cpu
