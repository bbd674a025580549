// The torch adapter's C++ half: one generic boxed kernel that runs any opforge op on torch
// tensors, written against LibTorch's stable C ABI only (the aoti_torch_* / torch_* shim and
// the header-only torch/csrc/stable helpers), so one build loads on every torch from 2.11 on.
#pragma once

#include <torch/csrc/stable/library.h>

#include <cstdint>

#include "opforge/error.h"
#include "opforge/op.h"

namespace opforge::torch_adapter {

// Runs `op` on a dispatcher stack: reads num_args inputs (taking ownership of each), validates
// them with opforge's validator, allocates contiguous results with torch on the inputs' device,
// runs the selected kernel on torch's current stream and leaves the results on the stack.
// opforge::Error propagates; torch turns it into a Python RuntimeError with its message.
void run_boxed(const OpDef& op, StableIValue* stack, uint64_t num_args, uint64_t num_outputs);

// The op's out variant (opforge/out.h's out_variant_schema) on a dispatcher stack: the op's
// arguments, then one tensor per result, checked by check_out and written by the kernel;
// nothing is left on the stack. torch bumps nothing itself: the caller marks the outs written.
void run_boxed_out(const OpDef& op, StableIValue* stack, uint64_t num_args, uint64_t num_outputs);

// Remembers the kind of an error that is about to cross into torch, which can only raise
// RuntimeError for it, so the Python side can raise the right type (opforge_torch_error_kind).
void remember_error(const Error& error);
// The kind of a remembered error whose message `text` contains (newest first), or -1.
int error_kind(const char* text);

}  // namespace opforge::torch_adapter
