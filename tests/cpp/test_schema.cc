// Schema::parse: the schema string is the single source of truth for every adapter, so both
// what it accepts and how it words each rejection are pinned here.
#include <gtest/gtest.h>

#include <string>

#include "opforge/schema.h"
#include "test_util.h"

namespace opforge {
namespace {

using testing::throws;

TEST(Schema, RmsNorm) {
  const std::string text = "rms_norm(Tensor x, Tensor weight, float eps=1e-6) -> Tensor";
  Schema s = Schema::parse(text);
  EXPECT_EQ(s.text, text);
  EXPECT_EQ(s.name, "rms_norm");
  EXPECT_EQ(s.num_results, 1);
  ASSERT_EQ(s.args.size(), 3u);
  EXPECT_EQ(s.args[0].name, "x");
  EXPECT_EQ(s.args[0].kind, ArgKind::tensor);
  EXPECT_FALSE(s.args[0].has_default());
  EXPECT_EQ(s.args[1].name, "weight");
  EXPECT_EQ(s.args[2].kind, ArgKind::float_);
  ASSERT_TRUE(s.args[2].default_value);
  EXPECT_EQ(std::get<double>(*s.args[2].default_value), 1e-6);
  EXPECT_EQ(s.num_tensor_args(), 2);
  EXPECT_EQ(s.arg_index("weight"), 1);
  EXPECT_EQ(s.arg_index("eps"), 2);
  EXPECT_EQ(s.arg_index("bias"), -1);
}

TEST(Schema, EveryKindAndDefault) {
  Schema s = Schema::parse(
      "f(Tensor a, Tensor? b, Tensor? c=None, float d=-2.5e3, int e=-7, bool g=True, "
      "bool h=False, str i='tanh', str j=\"a b,c)\", int k=0, float l=3) -> Tensor");
  ASSERT_EQ(s.args.size(), 11u);
  EXPECT_EQ(s.args[1].kind, ArgKind::optional_tensor);
  EXPECT_TRUE(s.args[1].has_default());  // an optional tensor defaults to None implicitly
  EXPECT_FALSE(s.args[1].default_value);
  EXPECT_EQ(s.args[2].kind, ArgKind::optional_tensor);
  EXPECT_FALSE(s.args[2].default_value);
  EXPECT_EQ(std::get<double>(*s.args[3].default_value), -2500.0);
  EXPECT_EQ(std::get<int64_t>(*s.args[4].default_value), -7);
  EXPECT_EQ(std::get<bool>(*s.args[5].default_value), true);
  EXPECT_EQ(std::get<bool>(*s.args[6].default_value), false);
  EXPECT_EQ(std::get<std::string>(*s.args[7].default_value), "tanh");
  // Separators inside quotes belong to the string.
  EXPECT_EQ(std::get<std::string>(*s.args[8].default_value), "a b,c)");
  EXPECT_EQ(std::get<int64_t>(*s.args[9].default_value), 0);
  // An integer literal for a float argument is still a float.
  EXPECT_EQ(std::get<double>(*s.args[10].default_value), 3.0);
  EXPECT_EQ(s.num_tensor_args(), 3);
}

TEST(Schema, ResultsAndSpacing) {
  EXPECT_EQ(Schema::parse("f(Tensor x) -> (Tensor, Tensor, Tensor)").num_results, 3);
  EXPECT_EQ(Schema::parse("f(Tensor x) -> (Tensor)").num_results, 1);
  Schema s = Schema::parse("  g (  Tensor   x ,int n = 4 )->Tensor  ");
  EXPECT_EQ(s.name, "g");
  ASSERT_EQ(s.args.size(), 2u);
  EXPECT_EQ(std::get<int64_t>(*s.args[1].default_value), 4);
  Schema none = Schema::parse("h() -> Tensor");
  EXPECT_TRUE(none.args.empty());
  EXPECT_EQ(none.num_tensor_args(), 0);
}

TEST(Schema, KindNamesAndAttrRepr) {
  EXPECT_EQ(arg_kind_name(ArgKind::tensor), "Tensor");
  EXPECT_EQ(arg_kind_name(ArgKind::optional_tensor), "Tensor?");
  EXPECT_EQ(arg_kind_name(ArgKind::float_), "float");
  EXPECT_EQ(arg_kind_name(ArgKind::int_), "int");
  EXPECT_EQ(arg_kind_name(ArgKind::bool_), "bool");
  EXPECT_EQ(arg_kind_name(ArgKind::str), "str");
  EXPECT_EQ(attr_repr(AttrValue{1e-6}), "1e-06");
  EXPECT_EQ(attr_repr(AttrValue{0.5}), "0.5");
  EXPECT_EQ(attr_repr(AttrValue{int64_t{-3}}), "-3");
  EXPECT_EQ(attr_repr(AttrValue{true}), "True");
  EXPECT_EQ(attr_repr(AttrValue{false}), "False");
  EXPECT_EQ(attr_repr(AttrValue{std::string("gelu")}), "'gelu'");
}

// Each bad schema with the exact reason the parser must give.
struct BadSchema {
  const char* text;
  const char* reason;
};

TEST(Schema, Errors) {
  const BadSchema cases[] = {
      {"f(Tensr x) -> Tensor",
       "unknown argument type 'Tensr' (expected Tensor, Tensor?, float, int, bool, str) at position 7"},
      {"f(Tensor x -> Tensor", "expected ')' at position 11"},
      {"f(Tensor x, Tensor x) -> Tensor", "duplicate argument 'x'"},
      {"f(Tensor x, float a=1, int b) -> Tensor",
       "argument 'b' without default follows one with a default"},
      {"f(Tensor? b, Tensor x) -> Tensor", "argument 'x' without default follows one with a default"},
      {"f(Tensor x=1) -> Tensor", "a Tensor argument cannot have a default"},
      {"f(Tensor? x=0) -> Tensor", "an optional tensor can only default to None"},
      {"f(int n=1.5) -> Tensor", "expected an integer"},
      {"f(int n=) -> Tensor", "expected an integer"},
      {"f(int n=12abc) -> Tensor", "expected an integer"},
      {"f(int n=99999999999999999999) -> Tensor", "expected an integer"},  // overflows int64
      {"f(float e=1e-x) -> Tensor", "expected a number"},
      {"f(float e=) -> Tensor", "expected a number"},
      {"f(float e=one) -> Tensor", "expected a number"},
      {"f(bool b=true) -> Tensor", "expected True or False"},
      {"f(str s=tanh) -> Tensor", "expected a quoted string default"},
      {"f(str s='tanh) -> Tensor", "unterminated string"},
      {"(Tensor x) -> Tensor", "expected op name at position 0"},
      {"1f(Tensor x) -> Tensor", "expected op name"},
      {"f(Tensor) -> Tensor", "expected argument name"},
      {"f(Tensor x,) -> Tensor", "expected argument type"},
      {"f(Tensor x) Tensor", "expected '-'"},
      {"f(Tensor x) - Tensor", "expected '>'"},
      {"f(Tensor x) -> float", "results must be Tensors"},
      {"f(Tensor x) -> (Tensor, int)", "results must be Tensors"},
      {"f(Tensor x) -> ()", "expected result type"},
      {"f(Tensor x) -> (Tensor", "expected ')'"},
      {"f(Tensor x) -> Tensor extra", "unexpected trailing text at position 22"},
      {"f Tensor x) -> Tensor", "expected '('"},
      {"", "expected op name at position 0"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    // Every message quotes the schema so the op's author can find it.
    EXPECT_TRUE(throws([&] { Schema::parse(c.text); }, ErrorKind::value,
                       std::string("invalid schema '") + c.text + "': "));
    EXPECT_TRUE(throws([&] { Schema::parse(c.text); }, ErrorKind::value, c.reason));
  }
}

TEST(Schema, OpDefRejectsUnknownArgumentsInDeclaration) {
  // A declaration naming an argument its schema lacks is the op author's bug: runtime error.
  EXPECT_TRUE(throws([] { OpDef("f(Tensor x) -> Tensor").dtypes("y", {DType::float32}); },
                     ErrorKind::runtime, "f(): declaration names unknown tensor argument 'y'"));
  EXPECT_TRUE(throws([] { OpDef("f(Tensor x, float a=1) -> Tensor").rank("a", 1); },
                     ErrorKind::runtime, "f(): declaration names unknown tensor argument 'a'"));
  EXPECT_TRUE(throws([] { OpDef("f(Tensor x) -> Tensor").same_dtype("x", "w"); }, ErrorKind::runtime,
                     "unknown tensor argument 'w'"));
  EXPECT_TRUE(throws([] { OpDef("f(Tensor x) -> Tensor").dispatch_on("z"); }, ErrorKind::runtime,
                     "unknown tensor argument 'z'"));
  EXPECT_TRUE(throws([] { OpDef("f(Tensor x) -> Tensr"); }, ErrorKind::value, "invalid schema"));
}

TEST(Schema, OpDefSlots) {
  OpDef op = OpDef("f(Tensor a, float s=1, Tensor? b=None, int k=2) -> Tensor")
                 .dispatch_on("b")
                 .dtypes("a", {DType::float32})
                 .rank("b", 1, 3);
  EXPECT_EQ(op.name(), "f");
  EXPECT_EQ(op.tensor_slot("a"), 0);
  EXPECT_EQ(op.tensor_slot("b"), 1);
  EXPECT_EQ(op.tensor_slot("s"), -1);
  EXPECT_EQ(op.attr_slot("s"), 0);
  EXPECT_EQ(op.attr_slot("k"), 1);
  EXPECT_EQ(op.attr_slot("a"), -1);
  EXPECT_EQ(op.tensor_name(1), "b");
  EXPECT_EQ(op.dispatch_slot(), 1);
  EXPECT_EQ(op.constraint(0).dtypes, std::vector<DType>{DType::float32});
  EXPECT_EQ(op.constraint(1).min_rank, 1);
  EXPECT_EQ(op.constraint(1).max_rank, 3);
  EXPECT_TRUE(throws([&] { op.tensor_name(2); }, ErrorKind::runtime, "f(): no tensor slot 2"));
  EXPECT_EQ(OpDef("g(int n) -> Tensor").dispatch_slot(), -1);  // no tensors to dispatch on
}

}  // namespace
}  // namespace opforge
