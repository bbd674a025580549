// Backend overrides from OPFORGE_BACKEND and the OPFORGE_CONFIG JSON file, read through
// reload_config(). Each test sets the environment, and the fixture puts everything back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "opforge/dispatch.h"
#include "opforge/parallel.h"
#include "test_util.h"

namespace opforge {
namespace {

using testing::throws;
using testing::view;

class Config : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_threads_ = num_threads();
    path_ = (std::filesystem::temp_directory_path() /
             ("opforge_config_" + std::to_string(getpid()) + ".json"))
                .string();
  }
  void TearDown() override {
    unsetenv("OPFORGE_BACKEND");
    unsetenv("OPFORGE_CONFIG");
    reload_config();
    set_num_threads(saved_threads_);
    std::remove(path_.c_str());
  }
  // Writes `json` to the temp file and points OPFORGE_CONFIG at it.
  void config(const std::string& json) {
    std::ofstream(path_) << json;
    setenv("OPFORGE_CONFIG", path_.c_str(), 1);
  }
  // What reload_config() rejects the current environment with (value errors only).
  ::testing::AssertionResult rejects(const std::string& message) {
    return throws([] { reload_config(); }, ErrorKind::value, message);
  }
  std::string source() const { return "config file " + path_; }

  std::string path_;
  int64_t saved_threads_ = 1;
  std::vector<float> xs{1, 2, 3};
};

TEST_F(Config, EnvironmentForEveryOp) {
  setenv("OPFORGE_BACKEND", "cpu", 1);
  reload_config();
  EXPECT_EQ(backend_override("add"), "cpu");
  EXPECT_EQ(backend_override("rms_norm"), "cpu");
  OpInputs in{{view(xs, DType::float32, {3})}, {}};
  EXPECT_EQ(select_kernel(find_op("add_one"), in).backend->name(), "cpu");
}

TEST_F(Config, EnvironmentPerOp) {
  setenv("OPFORGE_BACKEND", "rms_norm=cpu,,add_one=fake_gpu,", 1);  // empty items are skipped
  reload_config();
  EXPECT_EQ(backend_override("rms_norm"), "cpu");
  EXPECT_EQ(backend_override("add_one"), "fake_gpu");
  EXPECT_EQ(backend_override("add"), "");
  OpInputs in{{view(xs, DType::float32, {3})}, {}};
  EXPECT_TRUE(throws([&] { select_kernel(find_op("add_one"), in); }, ErrorKind::runtime,
                     "add_one(): backend 'fake_gpu' (forced by OPFORGE_BACKEND) cannot run on cpu tensors"));
}

TEST_F(Config, EnvironmentErrors) {
  setenv("OPFORGE_BACKEND", "tpu", 1);
  EXPECT_TRUE(rejects("OPFORGE_BACKEND names unknown backend 'tpu' (known: "));
  // The bad setting is not forgotten: the next kernel selection reports it again.
  OpInputs in{{view(xs, DType::float32, {3})}, {}};
  EXPECT_TRUE(throws([&] { select_kernel(find_op("add_one"), in); }, ErrorKind::value,
                     "OPFORGE_BACKEND names unknown backend 'tpu'"));
  setenv("OPFORGE_BACKEND", "rms_norm=cpu,addd=cpu", 1);
  EXPECT_TRUE(rejects("OPFORGE_BACKEND names unknown op 'addd'"));
  setenv("OPFORGE_BACKEND", "add=", 1);
  EXPECT_TRUE(rejects("OPFORGE_BACKEND names no backend for op 'add' (known: "));
  setenv("OPFORGE_BACKEND", "=", 1);
  EXPECT_TRUE(rejects("OPFORGE_BACKEND names no backend (known: "));
}

TEST_F(Config, FileSetsBackendsAndThreads) {
  config(R"({"backend": "cpu", "ops": {"add": "fake_gpu"}, "num_threads": 3})");
  reload_config();
  EXPECT_EQ(backend_override("rms_norm"), "cpu");
  EXPECT_EQ(backend_override("add"), "fake_gpu");
  EXPECT_EQ(num_threads(), 3);
  std::vector<float> ys{1, 2, 3};
  OpInputs in{{view(xs, DType::float32, {3}), view(ys, DType::float32, {3})}, {}};
  EXPECT_TRUE(throws([&] { select_kernel(find_op("add"), in); }, ErrorKind::runtime,
                     "add(): backend 'fake_gpu' (forced by " + source() + ") cannot run on cpu tensors"));
}

TEST_F(Config, EnvironmentBeatsFile) {
  config(R"({"ops": {"add": "fake_gpu", "rms_norm": "fake_gpu"}})");
  setenv("OPFORGE_BACKEND", "add=cpu", 1);
  reload_config();
  EXPECT_EQ(backend_override("add"), "cpu");
  EXPECT_EQ(backend_override("rms_norm"), "fake_gpu");
}

TEST_F(Config, ReloadReplacesRuntimeOverrides) {
  set_backend_override("add", "cpu");
  EXPECT_EQ(backend_override("add"), "cpu");
  reload_config();
  EXPECT_EQ(backend_override("add"), "");
  setenv("OPFORGE_CONFIG", "", 1);  // empty means no file
  reload_config();
  EXPECT_EQ(backend_override("add"), "");
}

TEST_F(Config, InvalidJsonNamesLineAndColumn) {
  config("{\"backend\": \"cpu\",\n  \"ops\" }");
  EXPECT_TRUE(rejects(source() + ": invalid JSON: line 2, column 9: expected ':'"));
  config("");
  EXPECT_TRUE(rejects(source() + ": invalid JSON: line 1, column 1: unexpected end of input"));
}

TEST_F(Config, FileErrors) {
  struct Case {
    const char* json;
    std::string message;  // after "config file <path>"
  };
  const Case cases[] = {
      {R"({"threads": 2})", ": unknown key 'threads' (expected backend, ops, num_threads)"},
      {R"({"ops": {"nope": "cpu"}})", " names unknown op 'nope'"},
      {R"({"backend": "tpu"})", " names unknown backend 'tpu' (known: "},
      {R"({"backend": ""})", " names no backend (known: "},
      {R"({"ops": {"add": ""}})", " names no backend for op 'add'"},
      {R"({"backend": 1})", ": 'backend' must be a string, got number"},
      {R"({"ops": ["add"]})", ": 'ops' must be an object, got array"},
      {R"({"ops": {"add": null}})", ": 'ops.add' must be a backend name, got null"},
      {R"([1])", ": expected a JSON object, got array"},
      {R"("cpu")", ": expected a JSON object, got string"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.json);
    config(c.json);
    EXPECT_TRUE(rejects(source() + c.message));
  }
}

TEST_F(Config, NumThreadsMustBeAWholeNumber) {
  const std::pair<const char*, const char*> cases[] = {
      {"0", "got 0"}, {"-2", "got -2"}, {"2.5", "got 2.5"}, {"1e999", "got inf"},
      {"1e9", "got 1e+09"}, {"\"4\"", "got string"}, {"true", "got boolean"},
  };
  for (const auto& [value, got] : cases) {
    SCOPED_TRACE(value);
    config(std::string(R"({"num_threads": )") + value + "}");
    EXPECT_TRUE(rejects(source() + ": 'num_threads' must be a whole number in [1, 65536], " + got));
    EXPECT_EQ(num_threads(), saved_threads_);  // untouched by a rejected value
  }
  config(R"({"num_threads": 2.0})");  // JSON has no integers: 2.0 is 2
  reload_config();
  EXPECT_EQ(num_threads(), 2);
}

TEST_F(Config, MissingFile) {
  setenv("OPFORGE_CONFIG", "/nonexistent/opforge.json", 1);
  EXPECT_TRUE(rejects("OPFORGE_CONFIG: cannot read /nonexistent/opforge.json"));
}

}  // namespace
}  // namespace opforge
