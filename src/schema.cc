// Parser for torch-style schema strings: name(Type arg[=default], ...) -> Tensor | (Tensor, ...)
#include "opforge/schema.h"

#include <cctype>
#include <charconv>
#include <cstdlib>

#include "opforge/error.h"

namespace opforge {

namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Schema parse() {
    Schema schema;
    schema.text = std::string(text_);
    schema.name = identifier("op name");
    expect('(');
    skip_space();
    if (!consume(')')) {
      do {
        schema.args.push_back(argument());
        for (size_t i = 0; i + 1 < schema.args.size(); ++i)
          if (schema.args[i].name == schema.args.back().name)
            error("duplicate argument '" + schema.args.back().name + "'");
      } while (consume(','));
      expect(')');
    }
    expect('-');
    expect('>');
    schema.num_results = results();
    skip_space();
    if (pos_ != text_.size()) error("unexpected trailing text");
    bool seen_default = false;
    for (const auto& a : schema.args) {
      if (a.has_default()) seen_default = true;
      else if (seen_default) error("argument '" + a.name + "' without default follows one with a default");
    }
    return schema;
  }

 private:
  [[noreturn]] void error(const std::string& what) {
    fail(ErrorKind::value, "invalid schema '", text_, "': ", what, " at position ", pos_);
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool consume(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!consume(c)) error(std::string("expected '") + c + "'");
  }
  std::string identifier(const char* what) {
    skip_space();
    size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_'))
      ++pos_;
    if (start == pos_ || std::isdigit(static_cast<unsigned char>(text_[start])))
      error(std::string("expected ") + what);
    return std::string(text_.substr(start, pos_ - start));
  }

  ArgSpec argument() {
    ArgSpec arg;
    std::string type = identifier("argument type");
    if (type == "Tensor") arg.kind = consume('?') ? ArgKind::optional_tensor : ArgKind::tensor;
    else if (type == "float") arg.kind = ArgKind::float_;
    else if (type == "int") arg.kind = ArgKind::int_;
    else if (type == "bool") arg.kind = ArgKind::bool_;
    else if (type == "str") arg.kind = ArgKind::str;
    else error("unknown argument type '" + type + "' (expected Tensor, Tensor?, float, int, bool, str)");
    arg.name = identifier("argument name");
    if (consume('=')) default_value(arg);
    return arg;
  }

  void default_value(ArgSpec& arg) {
    skip_space();
    size_t start = pos_;
    if (arg.kind == ArgKind::str) {
      char quote = pos_ < text_.size() ? text_[pos_] : '\0';
      if (quote != '\'' && quote != '"') error("expected a quoted string default");
      size_t end = text_.find(quote, pos_ + 1);
      if (end == std::string_view::npos) error("unterminated string");
      arg.default_value = std::string(text_.substr(pos_ + 1, end - pos_ - 1));
      pos_ = end + 1;
      return;
    }
    while (pos_ < text_.size() && text_[pos_] != ',' && text_[pos_] != ')' &&
           !std::isspace(static_cast<unsigned char>(text_[pos_])))
      ++pos_;
    std::string token(text_.substr(start, pos_ - start));
    switch (arg.kind) {
      case ArgKind::optional_tensor:
        if (token != "None") error("an optional tensor can only default to None");
        return;
      case ArgKind::tensor:
        error("a Tensor argument cannot have a default");
      case ArgKind::bool_:
        if (token != "True" && token != "False") error("expected True or False");
        arg.default_value = token == "True";
        return;
      case ArgKind::int_: {
        int64_t v = 0;
        auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), v);
        if (ec != std::errc() || end != token.data() + token.size()) error("expected an integer");
        arg.default_value = v;
        return;
      }
      case ArgKind::float_: {
        char* end = nullptr;
        double v = std::strtod(token.c_str(), &end);
        if (token.empty() || end != token.c_str() + token.size()) error("expected a number");
        arg.default_value = v;
        return;
      }
      case ArgKind::str:
        break;
    }
  }

  int64_t results() {
    if (consume('(')) {
      int64_t n = 0;
      do {
        if (identifier("result type") != "Tensor") error("results must be Tensors");
        ++n;
      } while (consume(','));
      expect(')');
      return n;
    }
    if (identifier("result type") != "Tensor") error("results must be Tensors");
    return 1;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

Schema Schema::parse(std::string_view text) { return Parser(text).parse(); }

int64_t Schema::num_tensor_args() const {
  int64_t n = 0;
  for (const auto& a : args) n += a.is_tensor();
  return n;
}

int64_t Schema::arg_index(std::string_view arg) const {
  // Every kernel and shape rule looks its arguments up by name, several times a call: sizes and
  // first letters tell most names apart without a call to memcmp.
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& name = args[i].name;
    if (name.size() == arg.size() && (arg.empty() || name[0] == arg[0]) && name == arg) return static_cast<int64_t>(i);
  }
  return -1;
}

std::string_view arg_kind_name(ArgKind kind) {
  switch (kind) {
    case ArgKind::tensor: return "Tensor";
    case ArgKind::optional_tensor: return "Tensor?";
    case ArgKind::float_: return "float";
    case ArgKind::int_: return "int";
    case ArgKind::bool_: return "bool";
    case ArgKind::str: return "str";
  }
  return "?";
}

std::string attr_repr(const AttrValue& value) {
  if (auto* d = std::get_if<double>(&value)) return str(*d);
  if (auto* i = std::get_if<int64_t>(&value)) return str(*i);
  if (auto* b = std::get_if<bool>(&value)) return *b ? "True" : "False";
  return "'" + std::get<std::string>(value) + "'";
}

}  // namespace opforge
