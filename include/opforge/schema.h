// An op's signature, parsed from a torch-style schema string such as
//   rms_norm(Tensor x, Tensor weight, float eps=1e-6) -> Tensor
// The schema is the single source of truth for argument names, kinds, defaults and the
// number of results; every adapter derives its signature from it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace opforge {

enum class ArgKind : uint8_t { tensor, optional_tensor, float_, int_, bool_, str };

// An attribute's value: the schema's float, int, bool or str.
using AttrValue = std::variant<double, int64_t, bool, std::string>;

struct ArgSpec {
  std::string name;
  ArgKind kind;
  std::optional<AttrValue> default_value;  // optional tensors default to None (nullopt)

  bool is_tensor() const { return kind == ArgKind::tensor || kind == ArgKind::optional_tensor; }
  bool has_default() const { return default_value.has_value() || kind == ArgKind::optional_tensor; }
};

struct Schema {
  std::string text;  // as written
  std::string name;
  std::vector<ArgSpec> args;
  int64_t num_results = 1;

  // Throws Error(value) naming the position of a syntax error.
  static Schema parse(std::string_view text);

  int64_t num_tensor_args() const;
  // Index among all args, or -1.
  int64_t arg_index(std::string_view arg) const;
};

std::string_view arg_kind_name(ArgKind kind);
// "1e-06", "True", "'tanh'" as the schema would spell it.
std::string attr_repr(const AttrValue& value);

}  // namespace opforge
