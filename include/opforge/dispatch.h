// Running an op: validate, infer result shapes, pick a kernel, call it. Every adapter
// (Python/DLPack, torch, JAX) goes through these three functions.
#pragma once

#include <span>
#include <string>

#include "opforge/backend.h"
#include "opforge/kernel.h"
#include "opforge/op.h"

namespace opforge {

// Checks the arguments against the declaration (kinds, dtypes, ranks, devices) and runs
// the shape rule. Throws typed Errors naming the op and argument.
Outputs infer_outputs(const OpDef& op, const OpInputs& inputs);

struct Selection {
  Backend* backend;
  KernelFn fn;
};

// The kernel for these inputs: the forced backend if the config names one for this op
// (an error if it cannot serve them), otherwise the best-scoring available backend
// with a kernel for the inputs' device and dispatch dtype.
Selection select_kernel(const OpDef& op, const OpInputs& inputs);

// The device all tensor inputs share (cpu for an op without tensors).
Device device_of(const OpInputs& inputs);

// Adapters meet dtypes opforge has no kernels for at all (complex, int16, float8) before the
// validator can: Error(type) in its words for a wrong dtype, "<op>(): '<arg>' must have dtype in
// [<the argument's dtypes>], got <got>" (every opforge dtype where the argument names none).
[[noreturn]] void fail_unsupported_dtype(const OpDef& op, std::string_view arg, std::string_view got);

// Adapters allocate the results themselves (from the backend or the framework): a failure
// there (out of memory) leaves as Error(runtime) "<op>(): cannot allocate its results: <why>".
[[noreturn]] void fail_result_allocation(const OpDef& op, const std::exception& error);

// Calls the kernel unless every output is empty. `scratch`: the framework's allocator for the
// kernel's temporary device memory, if the adapter has one (see KernelCall).
void run_kernel(const OpDef& op, const Selection& selection, const OpInputs& inputs,
                std::span<const TensorView> outputs, void* stream, ScratchAllocator* scratch = nullptr);

// Backend overrides. `op` empty means every op. Set by OPFORGE_BACKEND, the file named by
// OPFORGE_CONFIG (JSON), or at run time; an empty backend name removes the override.
void set_backend_override(const std::string& op, const std::string& backend);
std::string backend_override(const std::string& op);
// Re-reads OPFORGE_BACKEND and OPFORGE_CONFIG, replacing all overrides.
void reload_config();

}  // namespace opforge
