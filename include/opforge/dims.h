// Dims: a tensor's sizes or strides. A vector of int64 that keeps up to kInline values in
// itself and goes to the heap only past that: every call builds several views and shapes,
// and with std::vector each cost a malloc and a free (24 of them per opforge.add on NumPy
// arrays, a fifth of a small call's time). Its interface is std::vector's, where used.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <span>
#include <vector>

namespace opforge {

class Dims {
 public:
  using value_type = int64_t;
  using size_type = size_t;
  using difference_type = std::ptrdiff_t;
  using reference = int64_t&;
  using const_reference = const int64_t&;
  using pointer = int64_t*;
  using const_pointer = const int64_t*;
  using iterator = int64_t*;
  using const_iterator = const int64_t*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;

  // Ranks up to 6 stay inline (torch's sizes keep 5): 64 bytes in all.
  static constexpr size_t kInline = 6;

  Dims() noexcept = default;
  explicit Dims(size_t count, int64_t value = 0) { assign(count, value); }
  Dims(std::initializer_list<int64_t> values) { assign(values.begin(), values.end()); }
  template <std::input_iterator It>
  Dims(It first, It last) {
    assign(first, last);
  }
  Dims(std::span<const int64_t> values) { assign(values.begin(), values.end()); }  // NOLINT: as a vector's
  Dims(const std::vector<int64_t>& values) { assign(values.begin(), values.end()); }  // NOLINT
  Dims(const Dims& other) { assign(other.begin(), other.end()); }
  Dims(Dims&& other) noexcept { take(other); }
  Dims& operator=(const Dims& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  Dims& operator=(Dims&& other) noexcept {
    if (this != &other) {
      release();
      take(other);
    }
    return *this;
  }
  Dims& operator=(std::initializer_list<int64_t> values) {
    assign(values.begin(), values.end());
    return *this;
  }
  ~Dims() { release(); }

  size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  size_t capacity() const noexcept { return capacity_; }
  int64_t* data() noexcept { return data_; }
  const int64_t* data() const noexcept { return data_; }
  iterator begin() noexcept { return data_; }
  iterator end() noexcept { return data_ + size_; }
  const_iterator begin() const noexcept { return data_; }
  const_iterator end() const noexcept { return data_ + size_; }
  const_iterator cbegin() const noexcept { return data_; }
  const_iterator cend() const noexcept { return data_ + size_; }
  reverse_iterator rbegin() noexcept { return reverse_iterator(end()); }
  reverse_iterator rend() noexcept { return reverse_iterator(begin()); }
  const_reverse_iterator rbegin() const noexcept { return const_reverse_iterator(end()); }
  const_reverse_iterator rend() const noexcept { return const_reverse_iterator(begin()); }
  int64_t& operator[](size_t i) noexcept { return data_[i]; }
  const int64_t& operator[](size_t i) const noexcept { return data_[i]; }
  int64_t& front() noexcept { return data_[0]; }
  const int64_t& front() const noexcept { return data_[0]; }
  int64_t& back() noexcept { return data_[size_ - 1]; }
  const int64_t& back() const noexcept { return data_[size_ - 1]; }
  operator std::span<const int64_t>() const noexcept { return {data_, size_}; }  // NOLINT
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  // For code written against the std::vector that shapes were before (plugins' shape rules):
  // it compiles as it did, at the cost of the copy.
  operator std::vector<int64_t>() const { return vec(); }  // NOLINT

  void clear() noexcept { size_ = 0; }
  void reserve(size_t n) {
    if (n > capacity_) grow(n);
  }
  void resize(size_t n, int64_t value = 0) {
    reserve(n);
    if (n > size_) std::fill(data_ + size_, data_ + n, value);
    size_ = static_cast<uint32_t>(n);
  }
  void assign(size_t count, int64_t value) {
    clear();
    resize(count, value);
  }
  template <std::input_iterator It>
  void assign(It first, It last) {
    clear();
    if constexpr (std::forward_iterator<It>) {
      // One capacity check, then a plain copy: every copy of a view comes here. A range inside
      // this Dims fits its capacity, so nothing moves under it, and it is copied forward onto
      // the start, which is never past the range's own first value.
      const auto count = static_cast<size_t>(std::distance(first, last));
      reserve(count);
      int64_t* out = data_;
      for (; first != last; ++first) *out++ = static_cast<int64_t>(*first);
      size_ = static_cast<uint32_t>(count);
    } else {
      for (; first != last; ++first) push_back(static_cast<int64_t>(*first));
    }
  }
  void push_back(int64_t value) {
    if (size_ == capacity_) grow(capacity_ * 2);
    data_[size_++] = value;
  }
  int64_t& emplace_back(int64_t value) {
    push_back(value);
    return back();
  }
  void pop_back() noexcept { --size_; }
  iterator insert(const_iterator pos, int64_t value) { return insert(pos, size_t{1}, value); }
  iterator insert(const_iterator pos, size_t count, int64_t value) {
    const size_t at = static_cast<size_t>(pos - data_);
    reserve(size_ + count);
    std::move_backward(data_ + at, data_ + size_, data_ + size_ + count);
    std::fill(data_ + at, data_ + at + count, value);
    size_ += static_cast<uint32_t>(count);
    return data_ + at;
  }
  template <std::input_iterator It>
  iterator insert(const_iterator pos, It first, It last) {
    const size_t at = static_cast<size_t>(pos - data_);
    const Dims values(first, last);  // (may come from this Dims itself)
    reserve(size_ + values.size());
    std::move_backward(data_ + at, data_ + size_, data_ + size_ + values.size());
    std::copy(values.begin(), values.end(), data_ + at);
    size_ += values.size_;
    return data_ + at;
  }
  iterator insert(const_iterator pos, std::initializer_list<int64_t> values) {
    return insert(pos, values.begin(), values.end());
  }
  iterator erase(const_iterator pos) { return erase(pos, pos + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    const size_t at = static_cast<size_t>(first - data_), count = static_cast<size_t>(last - first);
    std::move(data_ + at + count, data_ + size_, data_ + at);
    size_ -= static_cast<uint32_t>(count);
    return data_ + at;
  }

  friend bool operator==(const Dims& a, const Dims& b) noexcept {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator<(const Dims& a, const Dims& b) noexcept {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  void grow(size_t n) {
    n = std::max<size_t>(n, kInline);
    auto* bigger = new int64_t[n];
    std::copy(data_, data_ + size_, bigger);
    release();
    data_ = bigger;
    capacity_ = static_cast<uint32_t>(n);
  }
  void release() noexcept {
    if (data_ != inline_) delete[] data_;
    data_ = inline_;
    capacity_ = kInline;
  }
  // Takes `other`'s values (its heap block, or a copy of its inline ones) and empties it.
  void take(Dims& other) noexcept {
    if (other.data_ == other.inline_) {
      std::copy(other.inline_, other.inline_ + other.size_, inline_);
    } else {
      data_ = other.data_;
      capacity_ = other.capacity_;
      other.data_ = other.inline_;
      other.capacity_ = kInline;
    }
    size_ = other.size_;
    other.size_ = 0;
  }

  int64_t* data_ = inline_;
  uint32_t size_ = 0, capacity_ = kInline;
  int64_t inline_[kInline];
};

}  // namespace opforge
