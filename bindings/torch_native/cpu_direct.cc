// See cpu_direct.h.
#include <Python.h>

#include "bindings/torch_native/cpu_direct.h"

#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#if __has_include(<torch/csrc/stable/c/shim.h>)
#include <torch/csrc/stable/c/shim.h>  // torch_parallel_for (2.10+)
#endif

#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "bindings/common/aten_dtype.h"
#include "opforge/backend.h"
#include "opforge/dispatch.h"
#include "opforge/out.h"
#include "opforge/parallel.h"
#include "opforge/registry.h"

namespace opforge::torch_native {

using aten::dtype_of;
using aten::scalar_type_of;

const c10::DispatchKeySet kNeedsDispatcher{
    c10::DispatchKey::Python,         c10::DispatchKey::PythonTLSSnapshot,
    c10::DispatchKey::PythonDispatcher, c10::DispatchKey::PreDispatch,
    c10::DispatchKey::Functionalize,  c10::DispatchKey::FuncTorchDynamicLayerFrontMode,
    c10::DispatchKey::FuncTorchDynamicLayerBackMode, c10::DispatchKey::FuncTorchBatched,
    c10::DispatchKey::FuncTorchGradWrapper, c10::DispatchKey::FuncTorchVmapMode,
    c10::DispatchKey::BatchedNestedTensor, c10::DispatchKey::Tracer};

bool plain_cpu(const at::Tensor& t) {
  return t.device().type() == c10::DeviceType::CPU && t.layout() == c10::kStrided &&
         !t.key_set().has_any(kNeedsDispatcher) && !t.is_conj() && !t.is_neg() &&
         !t._fw_grad(/*level=*/0).defined() && dtype_of(t.scalar_type()).has_value();
}

TensorView view_of(const at::Tensor& t) {
  TensorView view;
  view.data = t.data_ptr();
  view.dtype = *dtype_of(t.scalar_type());
  view.device = Device{DeviceType::cpu, 0};
  view.shape.assign(t.sizes().begin(), t.sizes().end());
  view.strides.assign(t.strides().begin(), t.strides().end());
  return view;
}

bool thread_allows_direct(const OpDef& op) {
  if (c10::impl::tls_local_dispatch_key_set().included_.has_any(kNeedsDispatcher)) return false;
  return op.autocast_policy() == AutocastPolicy::none || !at::autocast::is_autocast_enabled(at::kCPU);
}

namespace {

// Large results come from the CPU backend's memory, which keeps freed blocks mapped (torch's
// allocator returns them, so each large result would pay its page faults again); as in
// bindings/torch/call.cc.
constexpr int64_t kBackendAllocationBytes = int64_t{1} << 20;

// Below this many result elements a kernel takes about as long as handing the GIL over twice.
constexpr int64_t kReleaseGilElements = 16384;

at::Tensor allocate(Backend& backend, const TensorView& view) {
  const auto options = at::TensorOptions().dtype(scalar_type_of(view.dtype)).device(at::kCPU);
  if (view.nbytes() < kBackendAllocationBytes) return at::empty_strided(view.shape, view.strides, options);
  void* data = backend.allocate(view.nbytes(), view.device, nullptr);
  Backend* owner = &backend;
  auto release = [owner](void* p) { owner->release(p, Device{DeviceType::cpu, 0}, nullptr); };
  return at::from_blob(data, view.shape, view.strides, release, options);
}

}  // namespace

// opforge's parallel_for on torch's intra-op pool (opforge/parallel.h, UseForeignPool): one set
// of threads for torch's ops and opforge's. Through the stable shim, which runs it inside
// libtorch: at::parallel_for is inline, and its OpenMP pragma does nothing in code compiled
// without -fopenmp (measured: opforge's ops ran serial on it).
#if defined(TORCH_FEATURE_VERSION) && TORCH_FEATURE_VERSION >= TORCH_VERSION_2_10_0
void on_torch_pool(int64_t n, int64_t grain, void (*chunk)(int64_t, int64_t, void*), void* ctx) {
  if (torch_parallel_for(0, n, grain, chunk, ctx) != AOTI_TORCH_SUCCESS)
    fail(ErrorKind::runtime, "opforge torch adapter: torch_parallel_for failed");
}
constexpr ForeignParallelFor kTorchPool = on_torch_pool;
#else
constexpr ForeignParallelFor kTorchPool = nullptr;  // torch before 2.10: opforge's own pool
#endif

namespace {

// torch's profiler lists the call under the op's name, as it lists the dispatcher's calls.
struct Recorded {
  at::RecordFunction record{at::RecordScope::FUNCTION};
  std::string name;
  explicit Recorded(const OpDef& op) {
    if (!record.isActive()) return;
    name = "opforge::" + op.name();
    record.before(std::string_view(name), c10::ArrayRef<const c10::IValue>{});
  }
};

void run_on_torch_pool(const OpDef& op, const Selection& selection, const OpInputs& inputs,
                       std::span<const TensorView> views, bool holds_gil) {
  int64_t work = 0;
  for (const TensorView& v : views) work += v.numel();
  const UseForeignPool torch_pool(kTorchPool);
  if (!holds_gil || work < kReleaseGilElements) {
    run_kernel(op, selection, inputs, views, nullptr);
    return;
  }
  // Kernels may run long and use the thread pool; other Python threads go on meanwhile.
  PyThreadState* state = PyEval_SaveThread();
  try {
    run_kernel(op, selection, inputs, views, nullptr);
  } catch (...) {
    PyEval_RestoreThread(state);
    throw;
  }
  PyEval_RestoreThread(state);
}

}  // namespace

std::vector<at::Tensor> run_on_cpu(const OpDef& op, const OpInputs& inputs, bool holds_gil) {
  const Recorded recorded(op);
  const Outputs results = infer_outputs(op, inputs);
  const Selection selection = select_kernel(op, inputs);
  std::vector<at::Tensor> outputs;
  std::vector<TensorView> views;
  outputs.reserve(results.size());
  views.reserve(results.size());
  for (const OutputSpec& spec : results) {
    TensorView view{nullptr, spec.dtype, Device{DeviceType::cpu, 0}, spec.shape, spec.strides};
    try {
      outputs.push_back(allocate(*selection.backend, view));
    } catch (const std::exception& error) {  // opforge's Error or torch's c10::Error
      fail_result_allocation(op, error);
    }
    view.data = outputs.back().data_ptr();
    views.push_back(std::move(view));
  }
  run_on_torch_pool(op, selection, inputs, views, holds_gil);
  return outputs;
}

void write_on_cpu(const OpDef& op, const OpInputs& inputs, const std::vector<at::Tensor>& outs, bool holds_gil) {
  const Recorded recorded(op);
  const Outputs results = infer_outputs(op, inputs);
  std::vector<std::optional<TensorView>> given;
  std::vector<std::string> names;
  for (size_t i = 0; i < outs.size(); ++i) {
    given.emplace_back(view_of(outs[i]));
    names.push_back(out_name(i, outs.size()));
  }
  check_out(op, inputs, results, given, names);
  const Selection selection = select_kernel(op, inputs);
  std::vector<TensorView> views;
  for (auto& view : given) views.push_back(std::move(*view));
  run_on_torch_pool(op, selection, inputs, views, holds_gil);
  // As torch's own in-place writes: autograd then refuses a value it saved before this one.
  for (const at::Tensor& t : outs) t.unsafeGetTensorImpl()->bump_version();
}

std::optional<OpInputs> plain_inputs(const OpDef& op, c10::ArrayRef<c10::IValue> stack, bool below_autograd) {
  const auto& specs = op.schema().args;
  if (stack.size() != specs.size()) return std::nullopt;
  const bool grad_mode = !below_autograd && at::GradMode::is_enabled();
  OpInputs inputs = OpInputs::reserved_for(op.schema());
  for (size_t i = 0; i < specs.size(); ++i) {
    const c10::IValue& value = stack[i];
    switch (specs[i].kind) {
      case ArgKind::tensor:
      case ArgKind::optional_tensor: {
        if (value.isNone()) {
          if (specs[i].kind == ArgKind::tensor) return std::nullopt;
          inputs.tensors.emplace_back(std::nullopt);
          break;
        }
        if (!value.isTensor()) return std::nullopt;
        const at::Tensor& t = value.toTensor();
        if (!t.defined() || !plain_cpu(t) || (grad_mode && t.requires_grad())) return std::nullopt;
        inputs.tensors.emplace_back(view_of(t));
        break;
      }
      case ArgKind::float_:
        if (!value.isDouble()) return std::nullopt;
        inputs.attrs.emplace_back(value.toDouble());
        break;
      case ArgKind::int_:
        if (!value.isInt()) return std::nullopt;
        inputs.attrs.emplace_back(value.toInt());
        break;
      case ArgKind::bool_:
        if (!value.isBool()) return std::nullopt;
        inputs.attrs.emplace_back(value.toBool());
        break;
      case ArgKind::str:
        if (!value.isString()) return std::nullopt;
        inputs.attrs.emplace_back(value.toStringRef());
        break;
    }
  }
  return inputs;
}

}  // namespace opforge::torch_native
