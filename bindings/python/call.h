// Calling an opforge op from Python: bind arguments by the schema, validate, allocate,
// run on the framework's stream, return arrays of the caller's kind.
#pragma once

#include <nanobind/nanobind.h>

#include <string_view>
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

// A call's arguments as Python's vectorcall protocol hands them over: the positional values,
// then the keyword values, whose names are in `keywords` (a tuple of str, or null).
struct CallArgs {
  PyObject* const* values = nullptr;
  size_t positional = 0;
  PyObject* keywords = nullptr;
};

// The same from nanobind's *args and **kwargs; `storage` holds the values and names.
struct CallArgsStorage {
  std::vector<PyObject*> values;
  nanobind::object keywords;
};
CallArgs call_args(const nanobind::args& args, const nanobind::kwargs& kwargs, CallArgsStorage& storage);

// A call's arguments in schema order, and where its results go.
struct BoundArgs {
  std::vector<nanobind::handle> values;  // one per schema argument, null where the caller gave none
  nanobind::handle out;                  // out=: arrays to write the results into (null: none, or None)
};

// Orders positional and keyword arguments by the schema as a Python signature would, with
// Python's errors (TypeError naming the op): too many, unknown or repeated, or missing. The
// keyword `out` (every op's, unless its schema names an argument so) goes to BoundArgs::out.
BoundArgs bind(const OpDef& op, const CallArgs& args);

PreparedCall prepare_call(const OpDef& op, const BoundArgs& bound);

// What an error about an array opforge cannot use ends with in a call given out= on the generic
// path (arrays of different kinds), which runs only on memory opforge can reach itself.
inline constexpr const char* kOutNeedsMemory =
    " (out= with arrays of different kinds writes CPU or CUDA memory: for meta or forge tensors, or under "
    "torch.compile, pass torch tensors only, inputs and out)";

// The capsule a torch tensor is imported from (invalid where the generic import should take it)
// after the checks DLPack cannot carry: autograd and the negative bit. `writes_out`: the call was
// given out= (which, as torch's own out= variants, does not support autograd).
nanobind::object checked_torch_capsule(const OpDef& op, std::string_view name, nanobind::handle value,
                                       bool writes_out);

// Binds one Python value to a non-tensor schema argument; TypeError on the wrong kind.
AttrValue attr_from_python(const OpDef& op, const ArgSpec& arg, nanobind::handle value);

// Result (shape, dtype name) pairs from argument metadata alone: `tensors` holds, per tensor
// argument, None or (shape, dtype name[, (device type name, index)]); `attrs` maps attribute
// names to values. With devices given, tensors on different devices fail as in a call. Runs the
// validator and shape rule, so adapters (JAX abstract evaluation, torch fake kernels) get
// the same checks and messages as eager calls. `out`: None, or per result None or an out=
// tensor's metadata (as the tensors'), checked as an eager call checks out= (opforge/out.h's
// check_out; metadata shows no shared memory).
nanobind::list infer_call(const OpDef& op, const nanobind::sequence& tensors, const nanobind::dict& attrs,
                          nanobind::handle out);

nanobind::object call_op(const OpDef& op, const BoundArgs& bound);

}  // namespace opforge::python
