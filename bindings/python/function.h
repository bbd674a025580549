// opforge.<op>: each op as a module-level callable of its own type, opforge._core.Function.
//
// Python calls it through the vectorcall protocol: the arguments arrive as a C array with
// the keyword names beside them, and go straight to call_op. An Op's __call__ (a method on a
// nanobind class) first packs them into a tuple and a dict, twice; for a small array that
// packing was a sixth of the call. The object has a __dict__, so the Python package gives it
// the __name__, __signature__ and __doc__ that help() and IDEs read. Torch tensors and JAX
// tracers are handed to opforge.torch.<op> and opforge.jax.<op> (the routes those modules set
// as they load), so one function serves every framework with its own autograd and tracing.
#pragma once

#include <nanobind/nanobind.h>

#include "opforge/op.h"

namespace opforge::python {

// Adds the Function type to `m`; `raise_pending` is a nanobind function of `m` that rethrows
// the exception a failed call stored, so nanobind's own translators (opforge's included) set
// the Python error exactly as for any other binding.
void register_function_type(nanobind::module_& m);

// A new Function calling `op`. `jax_only`: opforge.jax.<op>, which runs calls on concrete JAX
// arrays itself and hands every other call to its _jax_route (the Python function opforge.jax
// makes, which traces, converts and reports errors).
nanobind::object make_function(const OpDef& op, bool jax_only = false);

}  // namespace opforge::python
