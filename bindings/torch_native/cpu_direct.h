// Running an opforge op's CPU kernel straight on plain CPU tensors, past torch's dispatcher: the
// direct call behind opforge.torch.<op> (direct_call.cc) and the backward op an autograd node
// runs (autograd.cc) both take this path where nothing else must see the call.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/core/DispatchKeySet.h>

#include <optional>
#include <vector>

#include "opforge/op.h"
#include "opforge/tensor.h"

namespace opforge::torch_native {

// Keys that mean "someone else must see this call": on a tensor, subclasses and FakeTensors
// (Python), functionalization, functorch's vmap/grad wrappers; in the thread's included set,
// an active dispatch mode or functorch transform, torch.jit.trace's tracer.
extern const c10::DispatchKeySet kNeedsDispatcher;

// A dense CPU tensor of an opforge dtype that nothing else must see: no subclass, functorch
// wrapper, conjugate or negative view, forward-AD tangent (the ops refuse forward AD).
bool plain_cpu(const at::Tensor& t);

// A plain CPU tensor's view (its data pointer includes the storage offset).
TensorView view_of(const at::Tensor& t);

// Whether this thread's state lets a call of op skip the dispatcher: no dispatch mode, functorch
// transform or tracer active, and no torch.autocast("cpu") where op has a cast policy (its
// autocast kernel casts).
bool thread_allows_direct(const OpDef& op);

// op's results for inputs (views of plain CPU tensors, attributes), validated, allocated (large
// ones from the CPU backend's memory, which keeps freed blocks mapped) and computed, recorded for
// torch's profiler as "opforge::<op>". opforge's Errors propagate. With holds_gil, the kernel
// runs without the GIL where it is long enough.
std::vector<at::Tensor> run_on_cpu(const OpDef& op, const OpInputs& inputs, bool holds_gil);

// op's results written into `outs` (plain CPU tensors, one per result, checked by opforge/out.h's
// check_out), each then marked written (its version counter bumped); otherwise as run_on_cpu.
void write_on_cpu(const OpDef& op, const OpInputs& inputs, const std::vector<at::Tensor>& outs, bool holds_gil);

// op's arguments from a dispatcher stack in schema order, for run_on_cpu; nullopt where a tensor
// is not plain CPU or, unless the caller is op's autograd kernel (below_autograd), needs a
// gradient while grad mode is on (the autograd kernel must see it).
std::optional<OpInputs> plain_inputs(const OpDef& op, c10::ArrayRef<c10::IValue> stack, bool below_autograd);

}  // namespace opforge::torch_native
