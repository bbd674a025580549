// The generic Python adapter's array handling: any DLPack or buffer-protocol object in,
// a view out; results handed back as the caller's own array kind (NumPy in, NumPy out).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include "opforge/backend.h"
#include "opforge/tensor.h"

namespace opforge::python {

namespace nb = nanobind;

enum class Framework { numpy, torch, jax, cupy, other };

// Which library `obj` belongs to, from its type's module (cached per type).
Framework framework_of(nb::handle obj);

// The name of `obj`'s type ("ndarray", "Tensor"), for error messages.
std::string python_type_name(nb::handle obj);
// str(obj), for error messages.
std::string python_str(nb::handle obj);
// An array's dtype as its framework names it (torch's without "torch."), or `fallback` for an
// object without a dtype: for arrays of a dtype opforge has no kernels for.
std::string framework_dtype_name(nb::handle array, std::string fallback);

// Imports `obj` without copying. Returns false when it is not an array.
bool import_array(nb::handle obj, nb::ndarray<nb::ro>& out);
TensorView view_of(const nb::ndarray<nb::ro>& array);
TensorView view_of(const nb::ndarray<>& array);  // a writable one (out=)

// `module.name`, looked up on first use into `cache` and kept for the process's life (the
// module's functions outlive any call). Called with the GIL held. Not a C++ function-level
// static: its initialization guard, held while the lookup may release the GIL, would deadlock
// against a thread that holds the GIL and waits on the guard.
PyObject* module_function(PyObject*& cache, const char* module, const char* name);

// A DLPack capsule of a torch CPU tensor from torch.utils.dlpack.to_dlpack (C++), not
// Tensor.__dlpack__ (a Python wrapper: most of a small call's time); invalid for other tensors,
// or where torch refuses, for the generic import to handle and word. The wrapper's checks
// (gradients, the negative bit) are prepare_call's.
nb::object torch_cpu_capsule(nb::handle tensor);

// Allocates a result on `backend` (dense: `strides` a reordering of row-major ones), owned by
// the returned capsule.
struct Allocation {
  TensorView view;
  nb::capsule owner;
  // After the kernel that writes it is queued (or failed): frees the memory, whenever the
  // capsule goes, only once the work queued on `stream` by then has finished.
  void fence(void* stream) const;
};
Allocation allocate(Backend& backend, DType dtype, const Dims& shape,
                    const Dims& strides, Device device, void* stream);

// Wraps an allocation as an array of `framework` (no copy).
nb::object wrap(const Allocation& result, Framework framework);

// The stream a call on `device` runs on: the framework's current stream for torch and CuPy
// CUDA arrays, CUDA's per-thread default stream for other CUDA arrays; nullptr on the CPU.
void* current_stream(Framework framework, Device device);
// True where the caller's framework cannot order its work after ours (JAX, unknown DLPack
// producers): the call waits for its stream before returning CUDA results.
bool synchronizes_on_return(Framework framework);

}  // namespace opforge::python
