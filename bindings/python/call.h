// Calling an opforge op from Python: bind arguments by the schema, validate, allocate,
// run on the framework's stream, return arrays of the caller's kind.
#pragma once

#include <nanobind/nanobind.h>

#include "opforge/op.h"

namespace opforge::python {

nanobind::object call_op(const OpDef& op, nanobind::args args, nanobind::kwargs kwargs);

}  // namespace opforge::python
