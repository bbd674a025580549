// torch.autocast("forge", dtype=...) for aten ops: the cast policies torch gives CUDA and CPU
// (ATen/autocast_mode.h's op lists: matrix products and convolutions in the lower precision,
// reductions and norms in float32, mixed-input ops at the widest dtype), registered at the
// AutocastPrivateUse1 key as a device vendor does; every other op passes through. Without the
// pass-through, any op under autocast on forge failed ("Could not run 'aten::normal_' with
// arguments from the 'Autocastforge' backend"). opforge's own ops get theirs from their
// declarations (bindings/torch_native/autocast.cc).
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

using namespace at;  // the op lists name Tensor, Scalar, ScalarType, IntArrayRef unqualified

#define FORGE_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define FORGE_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define FORGE_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
// (That list names its policy itself.)
#define FORGE_REDISPATCH(...) KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE(__VA_ARGS__)
#define FORGE_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(FORGE_LOWER_PRECISION)
  AT_FORALL_FP32(FORGE_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(FORGE_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(FORGE_REDISPATCH)
  AT_FORALL_PROMOTE(FORGE_PROMOTE)
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

}  // namespace
