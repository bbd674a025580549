// Walking strided and broadcast operands row by row. Ops that work elementwise hand this
// their operands' strides; it coalesces dimensions so the common cases (contiguous,
// scalar-broadcast) become one long row that SIMD code takes whole.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
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

// A short list of int64 kept inline (tensor ranks are small), moving to the heap past kInline:
// for_each_row runs on every elementwise call, where a handful of heap allocations cost as
// much as a small tensor's arithmetic.
class InlineInts {
 public:
  static constexpr size_t kInline = 12;
  void push_back(int64_t v) {
    if (heap_.empty() && size_ < kInline) {
      inline_[size_++] = v;
      return;
    }
    if (heap_.empty()) heap_.assign(inline_, inline_ + size_);
    heap_.push_back(v);
    ++size_;
  }
  int64_t* data() { return heap_.empty() ? inline_ : heap_.data(); }
  const int64_t* data() const { return heap_.empty() ? inline_ : heap_.data(); }
  int64_t& operator[](size_t i) { return data()[i]; }
  int64_t operator[](size_t i) const { return data()[i]; }
  int64_t& back() { return data()[size_ - 1]; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  int64_t inline_[kInline];
  size_t size_ = 0;
  std::vector<int64_t> heap_;
};

// A row: `len` elements; operand k starts at offsets[k] and steps by inner[k].
// Operand 0 is the contiguous output.
template <size_t N>
struct Row {
  std::array<int64_t, N> offsets;
  std::array<int64_t, N> inner;
  int64_t len;
};

// Calls fn(Row) over the whole iteration space of `shape`, in parallel chunks of at least
// `grain` elements. strides[k] are operand k's strides (already broadcast).
template <size_t N, typename F>
void for_each_row(const std::vector<int64_t>& shape, const std::array<std::vector<int64_t>, N>& strides,
                  int64_t grain, F&& fn) {
  // Drop size-1 dimensions, then merge neighbours every operand steps through evenly.
  InlineInts dims;
  std::array<InlineInts, N> st;
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
  const auto chunk = [&](int64_t begin, int64_t end) {
    // The chunk's first row is found by division; later rows by stepping an odometer over the
    // outer dimensions. Divisions per row (one per operand) cost as much as a short row's work.
    int64_t row = begin / inner, col = begin % inner;
    InlineInts index;
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
      fn(r);
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
  if (total == 0) return;
  if (total <= grain) chunk(0, total);
  else parallel_for(total, grain, chunk);
}

}  // namespace opforge::cpu
