// The CPU FFI handler: opforge's own thread pool does the parallel work.
#include "ffi_call.h"

namespace {
xla::ffi::Error run_on_cpu(xla::ffi::RemainingArgs args, xla::ffi::RemainingRets rets, xla::ffi::Dictionary attrs) {
  return opforge::jax::run(args, rets, attrs, opforge::Device{opforge::DeviceType::cpu, 0}, nullptr);
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(opforge_xla_ffi_cpu, run_on_cpu,
                              xla::ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs());
