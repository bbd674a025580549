// The CUDA FFI handler: kernels launch on XLA's stream for the device XLA made current.
#include <cuda_runtime_api.h>  // cudaStream_t only; nothing here links the runtime

#include "ffi_call.h"
#include "opforge/backend.h"

namespace {
xla::ffi::Error run_on_cuda(cudaStream_t stream, xla::ffi::RemainingArgs args, xla::ffi::RemainingRets rets,
                            xla::ffi::Dictionary attrs) {
  // libopforge owns the one CUDA runtime in the process; ask it, not a second copy here.
  int32_t device = 0;
  try {
    device = opforge::lookup_backend("cuda")->current_device();
  } catch (const std::exception& e) {
    return xla::ffi::Error::Internal(e.what());
  }
  return opforge::jax::run(args, rets, attrs, opforge::Device{opforge::DeviceType::cuda, device}, stream);
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(opforge_xla_ffi_cuda, run_on_cuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attrs());
