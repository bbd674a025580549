// The config file's JSON reader: what it builds, and that its errors point at the line and
// column a user has to fix.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "json.h"

namespace opforge::json {
namespace {

const Array& array_of(const Value& v) { return *std::get<std::shared_ptr<Array>>(v.data); }

// The std::invalid_argument message parse() throws for `text`, or "" if it parses.
std::string parse_error(std::string_view text) {
  try {
    parse(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Json, ObjectsArraysAndScalars) {
  Value doc = parse(R"( {
    "backend": "cpu",
    "ops": {"rms_norm": "cuda", "add": "cpu"},
    "list": [1, -2.5, 3e2, 4E-1, 0, true, false, null, [], {}, "x"],
    "empty": {}
  } )");
  ASSERT_TRUE(doc.is_object());
  EXPECT_EQ(doc.type_name(), "object");
  const Object& top = doc.object();
  EXPECT_EQ(top.size(), 4u);
  EXPECT_EQ(top.at("backend").string(), "cpu");
  EXPECT_EQ(top.at("ops").object().at("rms_norm").string(), "cuda");
  EXPECT_EQ(top.at("ops").object().size(), 2u);
  EXPECT_TRUE(top.at("empty").object().empty());

  const Array& list = array_of(top.at("list"));
  ASSERT_EQ(list.size(), 11u);
  EXPECT_EQ(list[0].number(), 1.0);
  EXPECT_EQ(list[1].number(), -2.5);
  EXPECT_EQ(list[2].number(), 300.0);
  EXPECT_EQ(list[3].number(), 0.4);
  EXPECT_EQ(list[4].number(), 0.0);
  EXPECT_EQ(std::get<bool>(list[5].data), true);
  EXPECT_EQ(std::get<bool>(list[6].data), false);
  EXPECT_TRUE(std::holds_alternative<std::nullptr_t>(list[7].data));
  EXPECT_TRUE(array_of(list[8]).empty());
  EXPECT_TRUE(list[9].object().empty());
  EXPECT_EQ(list[10].string(), "x");

  const char* names[] = {"number", "number", "number", "number", "number", "boolean",
                         "boolean", "null",  "array",  "object", "string"};
  for (size_t i = 0; i < list.size(); ++i) EXPECT_EQ(list[i].type_name(), names[i]) << i;
}

TEST(Json, TopLevelScalars) {
  EXPECT_EQ(parse("42").number(), 42.0);
  EXPECT_EQ(parse(" \"s\" ").string(), "s");
  EXPECT_TRUE(std::holds_alternative<std::nullptr_t>(parse("null").data));
  EXPECT_EQ(array_of(parse("[[1],[2,3]]")).size(), 2u);
}

TEST(Json, StringEscapes) {
  EXPECT_EQ(parse(R"("a\nb\tc\rd\be\ff\"g\\h\/i")").string(), "a\nb\tc\rd\be\ff\"g\\h/i");
  EXPECT_EQ(parse(R"("")").string(), "");
  // Keys go through the same reader.
  EXPECT_EQ(parse(R"({"a\"b": 1})").object().count("a\"b"), 1u);
}

TEST(Json, DuplicateKeyKeepsTheLast) {
  EXPECT_EQ(parse(R"({"a": 1, "a": 2})").object().at("a").number(), 2.0);
}

TEST(Json, ErrorsNameLineAndColumn) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {R"({"a" 1})", "line 1, column 6: expected ':'"},
      {"{\n  \"a\": 1,\n  \"b\" 2\n}", "line 3, column 7: expected ':'"},
      {R"({"a": 1 "b": 2})", "line 1, column 9: expected ',' or '}'"},
      {"[1, 2", "line 1, column 6: expected ',' or ']'"},
      {"[1 2]", "line 1, column 4: expected ',' or ']'"},
      {"{a: 1}", "line 1, column 2: expected a quoted key"},
      {"{\"a\": 1,}", "line 1, column 9: expected a quoted key"},
      {"", "line 1, column 1: unexpected end of input"},
      {"{\"a\":", "line 1, column 6: unexpected end of input"},
      {"  \n\n", "line 3, column 1: unexpected end of input"},
      {"\"abc", "line 1, column 5: unterminated string"},
      {"\"abc\\", "line 1, column 6: unterminated string"},
      {R"("\u0041")", "line 1, column 4: unsupported escape in string"},
      {"{} x", "line 1, column 4: unexpected text after the document"},
      {"[1] [2]", "line 1, column 5: unexpected text after the document"},
      {"+1", "line 1, column 1: unexpected character '+'"},
      {"tru", "line 1, column 1: unexpected character 't'"},
      {"'a'", "line 1, column 1: unexpected character '''"},
      {"-", "line 1, column 1: invalid number"},
      {"[-x]", "line 1, column 2: invalid number"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    EXPECT_EQ(parse_error(c.text), c.message);
  }
}

TEST(Json, RejectsNumbersJsonDoesNotHave) {
  // strtod reads these, JSON does not: a config with them is a mistake worth reporting.
  EXPECT_EQ(parse_error("-inf"), "line 1, column 1: invalid number");
  EXPECT_EQ(parse_error("-nan"), "line 1, column 1: invalid number");
  EXPECT_EQ(parse_error("[1, -Infinity]"), "line 1, column 5: invalid number");
  EXPECT_EQ(parse_error("1."), "line 1, column 1: invalid number");
  EXPECT_EQ(parse_error("1e+"), "line 1, column 1: invalid number");
  EXPECT_EQ(parse_error("0x10"), "line 1, column 2: unexpected text after the document");
  EXPECT_EQ(parse_error(".5"), "line 1, column 1: unexpected character '.'");
}

TEST(Json, LongNumbers) {
  // A number is read whole however long it is.
  const std::string digits(100, '1');
  EXPECT_DOUBLE_EQ(parse(digits).number(), std::strtod(digits.c_str(), nullptr));
  EXPECT_EQ(parse("1e999").number(), INFINITY);  // valid JSON; range is the reader's problem
  EXPECT_EQ(parse("-0.000125E+2").number(), -0.0125);
}

}  // namespace
}  // namespace opforge::json
