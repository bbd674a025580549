// Exposes the FFI handlers to Python as capsules for jax.ffi.register_ffi_target, and the
// FFI API version the handlers were compiled against (for the import-time ABI check).
#include <nanobind/nanobind.h>

#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;

extern "C" XLA_FFI_Error* opforge_xla_ffi_cpu(XLA_FFI_CallFrame* frame);
#ifdef OPFORGE_WITH_CUDA
extern "C" XLA_FFI_Error* opforge_xla_ffi_cuda(XLA_FFI_CallFrame* frame);
#endif

void register_jax_bindings(nb::module_& m) {
  nb::module_ jax = m.def_submodule("jax_ffi", "XLA FFI handlers for opforge.jax");
  jax.def("handlers", [] {
    nb::dict out;
    out["cpu"] = nb::capsule(reinterpret_cast<void*>(&opforge_xla_ffi_cpu));
#ifdef OPFORGE_WITH_CUDA
    out["CUDA"] = nb::capsule(reinterpret_cast<void*>(&opforge_xla_ffi_cuda));
#endif
    return out;
  });
  jax.attr("ffi_api_version") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
  jax.attr("jaxlib_version") = OPFORGE_JAXLIB_VERSION;
}
