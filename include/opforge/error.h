// The error model. Every user error is an opforge::Error whose kind maps to one Python
// exception type; the bindings translate it, so nothing in opforge aborts the process.
#pragma once

#include <cstdint>
#include <exception>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "opforge/dims.h"

namespace opforge {

enum class ErrorKind : uint8_t {
  type,             // TypeError: wrong dtype, wrong argument kind, missing argument
  value,            // ValueError: wrong shape, rank or attribute value
  not_implemented,  // NotImplementedError: no kernel for this dtype/device combination
  runtime,          // RuntimeError: device mismatch, unavailable backend, internal invariant
};

class Error : public std::exception {
 public:
  Error(ErrorKind kind, std::string message) : kind_(kind), message_(std::move(message)) {}
  ErrorKind kind() const noexcept { return kind_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  ErrorKind kind_;
  std::string message_;
};

namespace detail {
inline void append(std::ostringstream& out, std::span<const int64_t> shape) {
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
}
inline void append(std::ostringstream& out, const Dims& shape) { append(out, std::span<const int64_t>(shape)); }
inline void append(std::ostringstream& out, const std::vector<int64_t>& shape) {
  append(out, std::span<const int64_t>(shape));
}
template <typename T>
void append(std::ostringstream& out, const T& value) {
  out << value;
}
}  // namespace detail

// Concatenates its arguments; shapes (Dims, std::vector<int64_t>) print as "[2, 3]".
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream out;
  (detail::append(out, args), ...);
  return out.str();
}

template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, const Args&... args) {
  throw Error(kind, str(args...));
}

}  // namespace opforge

// Internal invariants: a broken one is a bug in opforge, reported as RuntimeError.
#define OPFORGE_CHECK(cond, ...)                                                          \
  do {                                                                                    \
    if (!(cond))                                                                          \
      ::opforge::fail(::opforge::ErrorKind::runtime, "opforge internal error at ",        \
                      __FILE__, ":", __LINE__, ": ", #cond, " ", ##__VA_ARGS__);          \
  } while (0)
