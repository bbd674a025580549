// The CUDA FFI handler: kernels launch on XLA's stream for the device XLA made current, their
// workspaces from XLA's scratch allocator.
#include <cuda_runtime_api.h>  // cudaStream_t only; nothing here links the runtime

#include <optional>

#include "ffi_call.h"
#include "opforge/backend.h"

namespace {

// The kernels' workspaces from XLA's scratch allocator (its device memory, which XLA takes back
// once the handler returns: the next user of it runs after this handler's work on XLA's stream).
class XlaScratch final : public opforge::ScratchAllocator {
 public:
  explicit XlaScratch(xla::ffi::ScratchAllocator& xla) : xla_(xla) {}
  void* allocate(size_t bytes) override {
    // 16: the most XLA accepts (XLA_FFI_DeviceMemory_Allocate refuses larger alignments, and the
    // wrapper reports that as no memory: every workspace failed so on the H100) and what opforge's
    // kernels need; XLA's allocator hands out 256-byte aligned blocks anyway.
    const std::optional<void*> p = xla_.Allocate(bytes, 16);
    return p ? *p : nullptr;
  }
  void release(void*) noexcept override {}  // XLA frees it all at the handler's end

 private:
  xla::ffi::ScratchAllocator& xla_;
};

xla::ffi::Error run_on_cuda(cudaStream_t stream, xla::ffi::ScratchAllocator xla_scratch, xla::ffi::RemainingArgs args,
                            xla::ffi::RemainingRets rets, xla::ffi::Dictionary attrs) {
  // libopforge owns the one CUDA runtime in the process; ask it, not a second copy here.
  int32_t device = 0;
  try {
    device = opforge::lookup_backend("cuda")->current_device();
  } catch (const std::exception& e) {
    return xla::ffi::Error::Internal(e.what());
  }
  XlaScratch scratch(xla_scratch);
  return opforge::jax::run(args, rets, attrs, opforge::Device{opforge::DeviceType::cuda, device}, stream, &scratch);
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(opforge_xla_ffi_cuda, run_on_cuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<xla::ffi::ScratchAllocator>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attrs());
