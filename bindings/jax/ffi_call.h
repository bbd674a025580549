// The JAX adapter's C++ half: one generic XLA FFI handler per platform that runs any opforge
// op. The op's name travels as the string attribute "op"; its attributes by their schema
// names; a bit mask "present" says which tensor arguments were passed (absent optional
// tensors are not operands). Results are allocated by XLA; the kernel gets XLA's stream.
#pragma once

#include "opforge/device.h"
#include "opforge/kernel.h"
#include "xla/ffi/api/ffi.h"

namespace opforge::jax {

namespace ffi = xla::ffi;

// Runs the op on XLA's buffers; `device` is where they live, `stream` XLA's stream (CUDA)
// or nullptr (CPU), `scratch` XLA's allocator for the kernels' workspaces (CUDA). Errors come
// back as ffi::Error naming the op.
ffi::Error run(ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs, Device device,
               void* stream, ScratchAllocator* scratch = nullptr);

}  // namespace opforge::jax
