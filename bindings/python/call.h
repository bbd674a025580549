// Calling an opforge op from Python: bind arguments by the schema, validate, allocate,
// run on the framework's stream, return arrays of the caller's kind.
#pragma once

#include <nanobind/nanobind.h>

#include <vector>

#include "arrays.h"
#include "opforge/dispatch.h"

namespace opforge::python {

// A call bound, validated and dispatched, before outputs are allocated and the kernel runs.
struct PreparedCall {
  OpInputs inputs;
  std::vector<nanobind::ndarray<nanobind::ro>> arrays;  // keep imported arrays alive
  Framework framework = Framework::other;
  Outputs outputs;
  Selection selection{nullptr, nullptr};
};

PreparedCall prepare_call(const OpDef& op, const nanobind::args& args, const nanobind::kwargs& kwargs);

nanobind::object call_op(const OpDef& op, nanobind::args args, nanobind::kwargs kwargs);

}  // namespace opforge::python
