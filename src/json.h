// A small JSON reader for opforge's config file: objects, arrays, strings, numbers, booleans,
// null. Errors name the line and column.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace opforge::json {

struct Value;
using Object = std::map<std::string, Value>;
using Array = std::vector<Value>;

struct Value {
  std::variant<std::nullptr_t, bool, double, std::string, std::shared_ptr<Array>,
               std::shared_ptr<Object>>
      data;

  bool is_string() const { return std::holds_alternative<std::string>(data); }
  bool is_number() const { return std::holds_alternative<double>(data); }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<Object>>(data); }
  const std::string& string() const { return std::get<std::string>(data); }
  double number() const { return std::get<double>(data); }
  const Object& object() const { return *std::get<std::shared_ptr<Object>>(data); }
  // "string", "number", ... for error messages.
  std::string_view type_name() const;
};

// Throws std::invalid_argument with "line L, column C: what".
Value parse(std::string_view text);

}  // namespace opforge::json
