// torch.autocast for opforge ops: each op's declared cast policy (OpDef::autocast) as a boxed
// kernel at the AutocastCPU, AutocastCUDA and AutocastPrivateUse1 (forge) keys. Autocast comes
// before autograd in torch's dispatch order, so the casts are recorded by autograd and the
// gradients reach float32 parameters in float32, as with torch's own ops. Casts of float32 leaf
// parameters to the lower precision are cached for the autocast region (at::autocast::cached_cast,
// as for torch's linear). Ops with no policy have no kernel here: autocast passes them through.
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "bindings/torch_native/autocast.h"
#include "opforge/registry.h"

namespace opforge::torch_native {

namespace {

class AutocastKernel final : public c10::OperatorKernel {
 public:
  AutocastKernel(AutocastPolicy policy, c10::DeviceType device) : policy_(policy), device_(device) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    const size_t start = stack->size() - n;
    std::optional<c10::ScalarType> to = target(*stack, start);
    if (to) {
      for (size_t i = start; i < stack->size(); ++i)
        if ((*stack)[i].isTensor()) (*stack)[i] = at::autocast::cached_cast(*to, (*stack)[i].toTensor(), device_);
    }
    // Below this key for the rest of the call (torch's own autocast kernels do the same).
    c10::impl::ExcludeDispatchKeyGuard no_autocast(at::autocast::get_autocast_dispatch_key_from_device_type(device_));
    op.callBoxed(stack);
  }

 private:
  // The dtype this call's floating tensors become; nullopt: none to cast.
  std::optional<c10::ScalarType> target(const torch::jit::Stack& stack, size_t start) const {
    switch (policy_) {
      case AutocastPolicy::lower_precision: return at::autocast::get_lower_precision_fp_from_device_type(device_);
      case AutocastPolicy::fp32: return at::kFloat;
      case AutocastPolicy::promote: {
        std::optional<c10::ScalarType> widest;
        for (size_t i = start; i < stack.size(); ++i) {
          if (!stack[i].isTensor()) continue;
          const at::Tensor& t = stack[i].toTensor();
          if (!t.is_floating_point() || t.device().type() != device_) continue;
          widest = widest ? at::promote_types(*widest, t.scalar_type()) : t.scalar_type();
        }
        return widest;
      }
      case AutocastPolicy::none: break;
    }
    return std::nullopt;
  }

  AutocastPolicy policy_;
  c10::DeviceType device_;
};

// Ops given their autocast kernels so far (all while this library loads; a plugin's later).
std::set<std::string>& implemented() {
  static std::set<std::string> names;
  return names;
}

void implement(torch::Library& m, c10::DispatchKey key, c10::DeviceType device, const OpDef& op, std::string& errors) {
  try {
    auto kernel =
        torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AutocastKernel>(op.autocast_policy(), device));
    m.impl(op.name().c_str(), torch::dispatch(key, std::move(kernel)));
  } catch (const std::exception& e) {
    errors += "autocast kernel of '" + op.name() + "' for " + c10::toString(key) + ": " + e.what() + "\n";
  }
}

}  // namespace

void implement_autocast(torch::Library& m, std::string& errors) {
  for (const OpDef* op : all_ops()) {
    if (op->autocast_policy() == AutocastPolicy::none || !implemented().insert(op->name()).second) continue;
    implement(m, c10::DispatchKey::AutocastCPU, c10::DeviceType::CPU, *op, errors);
    implement(m, c10::DispatchKey::AutocastCUDA, c10::DeviceType::CUDA, *op, errors);
    implement(m, c10::DispatchKey::AutocastPrivateUse1, c10::DeviceType::PrivateUse1, *op, errors);
  }
}

}  // namespace opforge::torch_native
