#include "json.h"

#include <cctype>
#include <cstdlib>
#include <stdexcept>

namespace opforge::json {

std::string_view Value::type_name() const {
  static constexpr std::string_view names[] = {"null", "boolean", "number", "string", "array", "object"};
  return names[data.index()];
}

namespace {

class Reader {
 public:
  explicit Reader(std::string_view text) : s_(text) {}

  Value document() {
    Value v = value();
    space();
    if (i_ != s_.size()) error("unexpected text after the document");
    return v;
  }

 private:
  [[noreturn]] void error(const std::string& what) {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < i_ && k < s_.size(); ++k) {
      if (s_[k] == '\n') ++line, col = 1;
      else ++col;
    }
    throw std::invalid_argument("line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + what);
  }
  void space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }

  Value value() {
    space();
    if (i_ >= s_.size()) error("unexpected end of input");
    char c = s_[i_];
    if (c == '{') return {object()};
    if (c == '[') return {array()};
    if (c == '"') return {string()};
    if (literal("true")) return {true};
    if (literal("false")) return {false};
    if (literal("null")) return {nullptr};
    if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) return {number()};
    error(std::string("unexpected character '") + c + "'");
  }

  std::shared_ptr<Object> object() {
    auto obj = std::make_shared<Object>();
    ++i_;
    space();
    if (i_ < s_.size() && s_[i_] == '}') return ++i_, obj;
    while (true) {
      space();
      if (i_ >= s_.size() || s_[i_] != '"') error("expected a quoted key");
      std::string key = string();
      space();
      if (i_ >= s_.size() || s_[i_] != ':') error("expected ':'");
      ++i_;
      (*obj)[key] = value();
      space();
      if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
      if (i_ < s_.size() && s_[i_] == '}') return ++i_, obj;
      error("expected ',' or '}'");
    }
  }

  std::shared_ptr<Array> array() {
    auto arr = std::make_shared<Array>();
    ++i_;
    space();
    if (i_ < s_.size() && s_[i_] == ']') return ++i_, arr;
    while (true) {
      arr->push_back(value());
      space();
      if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
      if (i_ < s_.size() && s_[i_] == ']') return ++i_, arr;
      error("expected ',' or ']'");
    }
  }

  std::string string() {
    std::string out;
    ++i_;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c != '\\') { out += c; continue; }
      if (i_ >= s_.size()) break;
      char e = s_[i_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case '"': case '\\': case '/': out += e; break;
        default: error("unsupported escape in string");  // \u is not needed for op and backend names
      }
    }
    if (i_ >= s_.size()) error("unterminated string");
    ++i_;
    return out;
  }

  // JSON's number grammar, checked before strtod reads the span: strtod alone would also take
  // "inf", "nan" and hex ("num_threads": -inf would then reach an integer cast).
  double number() {
    const size_t start = i_;
    auto digits = [&] {
      const size_t from = i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
      return i_ > from;
    };
    if (s_[i_] == '-') ++i_;
    bool ok = digits();
    if (ok && i_ < s_.size() && s_[i_] == '.') ++i_, ok = digits();
    if (ok && i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      ok = digits();
    }
    if (!ok) {
      i_ = start;
      error("invalid number");
    }
    return std::strtod(std::string(s_.substr(start, i_ - start)).c_str(), nullptr);
  }

  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace

Value parse(std::string_view text) { return Reader(text).document(); }

}  // namespace opforge::json
