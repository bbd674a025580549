#include "call.h"

#include <dlfcn.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>

#include <array>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "opforge/dispatch.h"
#include "opforge/out.h"
#include "opforge/parallel.h"

namespace opforge::torch_adapter {

namespace {

void check(AOTITorchError code, const char* call) {
  if (code != AOTI_TORCH_SUCCESS) fail(ErrorKind::runtime, "opforge torch adapter: ", call, " failed");
}

// An owning AtenTensorHandle. Plain handles (not torch::stable::Tensor's shared_ptr) keep
// the per-call cost down; the shim's delete drops one reference, like ~at::Tensor.
struct TensorDeleter {
  void operator()(AtenTensorOpaque* t) const { aoti_torch_delete_tensor_object(t); }
};
using OwnedTensor = std::unique_ptr<AtenTensorOpaque, TensorDeleter>;

// torch's dtype and device codes come from the shim at run time: the stable ABI promises the
// functions, not the numbers.
struct DTypeCode {
  int32_t code;
  DType dtype;
};
const std::array<DTypeCode, 9>& dtype_codes() {
  static const std::array<DTypeCode, 9> codes{{
      {aoti_torch_dtype_float32(), DType::float32},
      {aoti_torch_dtype_float64(), DType::float64},
      {aoti_torch_dtype_float16(), DType::float16},
      {aoti_torch_dtype_bfloat16(), DType::bfloat16},
      {aoti_torch_dtype_int8(), DType::int8},
      {aoti_torch_dtype_uint8(), DType::uint8},
      {aoti_torch_dtype_int32(), DType::int32},
      {aoti_torch_dtype_int64(), DType::int64},
      {aoti_torch_dtype_bool(), DType::boolean},
  }};
  return codes;
}

// Names of torch dtypes opforge has no DType for, so the error says which one arrived.
std::string unsupported_dtype_name(int32_t code) {
  const std::pair<int32_t, const char*> names[] = {
      {aoti_torch_dtype_int16(), "int16"},           {aoti_torch_dtype_uint16(), "uint16"},
      {aoti_torch_dtype_uint32(), "uint32"},         {aoti_torch_dtype_uint64(), "uint64"},
      {aoti_torch_dtype_complex32(), "complex32"},   {aoti_torch_dtype_complex64(), "complex64"},
      {aoti_torch_dtype_complex128(), "complex128"}, {aoti_torch_dtype_float8_e4m3fn(), "float8_e4m3fn"},
      {aoti_torch_dtype_float8_e5m2(), "float8_e5m2"},
  };
  for (const auto& [c, name] : names)
    if (c == code) return name;
  return str("torch dtype code ", code);
}

int32_t torch_dtype(DType dtype) {
  for (const DTypeCode& c : dtype_codes())
    if (c.dtype == dtype) return c.code;
  fail(ErrorKind::runtime, "opforge torch adapter: no torch dtype for ", dtype_name(dtype));
}

// Must agree with python/opforge/torch.py, which raises the same message from fake kernels.
// `torch_device` receives torch's own (type, index) for the allocation of the results. `out`:
// the result this tensor is to hold (an out= tensor), named in a dtype error.
TensorView view_of(const OpDef& op, const std::string& name, AtenTensorHandle t,
                   std::pair<int32_t, int32_t>& torch_device, const OutputSpec* out = nullptr) {
  TensorView view;
  int32_t code = 0;
  check(aoti_torch_get_dtype(t, &code), "aoti_torch_get_dtype");
  bool known = false;
  for (const DTypeCode& c : dtype_codes())
    if (c.code == code) {
      view.dtype = c.dtype;
      known = true;
    }
  if (!known && out)
    fail(ErrorKind::type, op.name(), "(): '", name, "' must have dtype ", dtype_name(out->dtype), ", got ",
         unsupported_dtype_name(code));
  if (!known) fail_unsupported_dtype(op, name, unsupported_dtype_name(code));
  int32_t device_type = 0;
  check(aoti_torch_get_device_type(t, &device_type), "aoti_torch_get_device_type");
  check(aoti_torch_get_device_index(t, &view.device.index), "aoti_torch_get_device_index");
  torch_device = {device_type, view.device.index};
  if (device_type == aoti_torch_device_type_cpu())
    view.device = Device{DeviceType::cpu, 0};  // torch's CPU index is -1, opforge's 0
  else if (device_type == aoti_torch_device_type_cuda())
    view.device.type = DeviceType::cuda;
  else
    fail(ErrorKind::runtime, op.name(), "(): '", name, "' is on a device opforge cannot run on (torch device type ",
         device_type, ")");
  int64_t dim = 0;
  int64_t* sizes = nullptr;
  int64_t* strides = nullptr;
  check(aoti_torch_get_dim(t, &dim), "aoti_torch_get_dim");
  check(aoti_torch_get_sizes(t, &sizes), "aoti_torch_get_sizes");
  check(aoti_torch_get_strides(t, &strides), "aoti_torch_get_strides");
  view.shape.assign(sizes, sizes + dim);
  view.strides.assign(strides, strides + dim);
  check(aoti_torch_get_data_ptr(t, &view.data), "aoti_torch_get_data_ptr");  // storage offset included
  return view;
}

// torch's current CUDA stream, from the CUDA shim in libtorch_cuda.so. Looked up at run time:
// a CPU-only torch has no such library, and linking it would stop the adapter from loading there.
void* current_cuda_stream(int32_t device_index) {
  using GetStream = AOTITorchError (*)(int32_t, void**);
  static const GetStream get = [] {
    void* lib = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
    return lib ? reinterpret_cast<GetStream>(dlsym(lib, "aoti_torch_get_current_cuda_stream")) : nullptr;
  }();
  if (!get) fail(ErrorKind::runtime, "opforge torch adapter: this torch has no CUDA stream shim (libtorch_cuda.so)");
  void* stream = nullptr;
  check(get(device_index, &stream), "aoti_torch_get_current_cuda_stream");
  return stream;
}

// Copies and frees a str argument; false if the shim failed (the handle is freed either way).
bool take_string(StableIValue value, std::string& out) {
  auto handle = torch::stable::detail::to<StringHandle>(value);
  size_t length = 0;
  const char* data = nullptr;
  const bool ok = torch_string_length(handle, &length) == AOTI_TORCH_SUCCESS &&
                  torch_string_c_str(handle, &data) == AOTI_TORCH_SUCCESS;
  if (ok) out.assign(data, length);
  torch_delete_string(handle);
  return ok;
}

// Large CPU results come from the opforge backend's memory, which keeps freed blocks mapped:
// torch's CPU allocator returns big blocks to the system, so every large result would pay its
// page faults again (at 64 MiB that costs more than the op). Small results stay with torch.
constexpr int64_t kBackendAllocationBytes = int64_t{1} << 20;

OwnedTensor torch_empty(const TensorView& view, std::pair<int32_t, int32_t> torch_device) {
  AtenTensorHandle out = nullptr;
  check(aoti_torch_empty_strided(static_cast<int64_t>(view.shape.size()), view.shape.data(), view.strides.data(),
                                 torch_dtype(view.dtype), torch_device.first, torch_device.second, &out),
        "aoti_torch_empty_strided");
  return OwnedTensor(out);
}

// A torch tensor over memory from `backend`, handed back to it when torch frees the storage
// (from whichever thread drops the last reference; the backend's release is thread-safe).
OwnedTensor from_backend_memory(Backend& backend, const TensorView& view, std::pair<int32_t, int32_t> torch_device) {
  void* data = backend.allocate(view.nbytes(), view.device, nullptr);
  struct Owner {
    Backend* backend;
    Device device;
  };
  auto* owner = new Owner{&backend, view.device};
  auto release = [](void* ptr, void* ctx) {
    auto* o = static_cast<Owner*>(ctx);
    o->backend->release(ptr, o->device, nullptr);  // CPU memory: nothing queued
    delete o;
  };
  AtenTensorHandle out = nullptr;
  const AOTITorchError code =
      torch_from_blob(data, static_cast<int64_t>(view.shape.size()), view.shape.data(), view.strides.data(), 0,
                      torch_dtype(view.dtype), torch_device.first, torch_device.second, &out,
                      aoti_torch_layout_strided(), nullptr, 0, release, owner);
  if (code != AOTI_TORCH_SUCCESS) {
    release(data, owner);
    check(code, "torch_from_blob");
  }
  return OwnedTensor(out);
}

// A CUDA kernel's workspaces from torch's caching allocator (uint8 tensors on the call's device),
// so memory torch holds cached serves opforge too, and memory opforge used goes back to torch's
// cache. Allocated with the call's stream current, as torch's allocator expects: a block freed
// here is reused only by work queued after it on that stream.
class TorchScratch final : public ScratchAllocator {
 public:
  explicit TorchScratch(std::pair<int32_t, int32_t> device) : device_(device) {}
  void* allocate(size_t bytes) override {
    const int64_t size = static_cast<int64_t>(bytes), stride = 1;
    AtenTensorHandle t = nullptr;
    if (aoti_torch_empty_strided(1, &size, &stride, aoti_torch_dtype_uint8(), device_.first, device_.second, &t) !=
        AOTI_TORCH_SUCCESS)
      return nullptr;  // torch's out of memory (its cache already emptied and retried)
    OwnedTensor owned(t);
    void* data = nullptr;
    if (aoti_torch_get_data_ptr(t, &data) != AOTI_TORCH_SUCCESS) return nullptr;
    held_.emplace_back(data, std::move(owned));
    return data;
  }
  void release(void* p) noexcept override {
    for (auto it = held_.begin(); it != held_.end(); ++it)
      if (it->first == p) {
        held_.erase(it);  // the tensor's storage goes back to torch's cache
        return;
      }
  }

 private:
  std::pair<int32_t, int32_t> device_;
  std::vector<std::pair<void*, OwnedTensor>> held_;
};

// Errors about to cross into torch, newest last, so Python can look up their kind by message.
// A few suffice: Python asks right after the failing call, possibly from another thread.
std::mutex error_mutex;
std::deque<std::pair<ErrorKind, std::string>> recent_errors;

// opforge's parallel_for on torch's intra-op pool (stable torch_parallel_for): one set of threads
// for torch's ops and opforge's.
void on_torch_pool(int64_t n, int64_t grain, void (*chunk)(int64_t, int64_t, void*), void* ctx) {
  torch::stable::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) { chunk(begin, end, ctx); });
}

}  // namespace

void remember_error(const Error& error) {
  std::lock_guard<std::mutex> lock(error_mutex);
  recent_errors.emplace_back(error.kind(), error.what());
  if (recent_errors.size() > 16) recent_errors.pop_front();
}

int error_kind(const char* text) {
  const std::string_view haystack(text ? text : "");
  std::lock_guard<std::mutex> lock(error_mutex);
  for (auto it = recent_errors.rbegin(); it != recent_errors.rend(); ++it)
    if (haystack.find(it->second) != std::string_view::npos) return static_cast<int>(it->first);
  return -1;
}

namespace {

// The call's arguments from a dispatcher stack, every tensor owned before anything can throw
// (an error never leaks a reference): the op's, then `extra` tensors (an out variant's outs).
struct StackArgs {
  std::vector<OwnedTensor> held;  // per argument; null for attributes and absent optionals
  OpInputs inputs;
  std::pair<int32_t, int32_t> torch_device{aoti_torch_device_type_cpu(), -1};  // the first tensor's
};

StackArgs read_stack(const OpDef& op, StableIValue* stack, uint64_t num_args, size_t extra) {
  const auto& specs = op.schema().args;
  StackArgs a;
  a.held.resize(specs.size() + extra);
  std::vector<AttrValue> attrs;
  const char* failed = nullptr;  // shim failures on the way are raised once the loop is done
  for (size_t i = 0; i < a.held.size() && i < num_args; ++i) {
    const StableIValue value = stack[i];
    switch (i < specs.size() ? specs[i].kind : ArgKind::tensor) {
      case ArgKind::tensor: a.held[i].reset(torch::stable::detail::to<AtenTensorHandle>(value)); break;
      case ArgKind::optional_tensor: {
        // The stable headers unbox (and free) the optional as the targeted torch version boxes it.
        auto t = torch::stable::detail::to<std::optional<torch::stable::Tensor>>(value);
        AtenTensorHandle own = nullptr;
        if (t && aoti_torch_new_tensor_handle(t->get(), &own) != AOTI_TORCH_SUCCESS)
          failed = "aoti_torch_new_tensor_handle";
        a.held[i].reset(own);
        break;
      }
      case ArgKind::float_: attrs.emplace_back(torch::stable::detail::to<double>(value)); break;
      case ArgKind::int_: attrs.emplace_back(torch::stable::detail::to<int64_t>(value)); break;
      case ArgKind::bool_: attrs.emplace_back(torch::stable::detail::to<bool>(value)); break;
      case ArgKind::str: {
        std::string text;
        if (!take_string(value, text)) failed = "reading a str argument";
        attrs.emplace_back(std::move(text));
        break;
      }
    }
  }
  if (failed) fail(ErrorKind::runtime, "opforge torch adapter: ", failed, " failed");
  OPFORGE_CHECK(num_args == a.held.size(), "torch called ", op.name(), " with ", num_args, " arguments");

  a.inputs.attrs = std::move(attrs);
  bool have_device = false;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].is_tensor()) continue;
    if (!a.held[i]) {
      a.inputs.tensors.emplace_back(std::nullopt);
      continue;
    }
    std::pair<int32_t, int32_t> this_device;
    a.inputs.tensors.emplace_back(view_of(op, specs[i].name, a.held[i].get(), this_device));
    if (!have_device) a.torch_device = this_device;  // results go where the first tensor is
    have_device = true;
  }
  return a;
}

// Runs the selected kernel into `views`: a CUDA kernel on torch's current stream of the
// tensors' device, with that device current and torch's allocator for its workspaces; a CPU
// kernel's parallel_for on torch's intra-op pool (opforge/parallel.h, UseForeignPool).
void launch(const OpDef& op, const Selection& selection, const OpInputs& inputs, std::span<const TensorView> views,
            Device device, std::pair<int32_t, int32_t> torch_device) {
  void* stream = device.type == DeviceType::cuda ? current_cuda_stream(device.index) : nullptr;
  std::optional<TorchScratch> scratch;
  if (device.type == DeviceType::cuda) scratch.emplace(torch_device);
  const UseForeignPool torch_pool(device.type == DeviceType::cpu ? on_torch_pool : nullptr);
  run_kernel(op, selection, inputs, views, stream, scratch ? &*scratch : nullptr);
}

}  // namespace

void run_boxed(const OpDef& op, StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  StackArgs a = read_stack(op, stack, num_args, 0);
  OPFORGE_CHECK(num_outputs == static_cast<uint64_t>(op.schema().num_results), "torch called ", op.name(),
                " for ", num_outputs, " results");
  const Outputs results = infer_outputs(op, a.inputs);
  const Selection selection = select_kernel(op, a.inputs);
  const Device device = device_of(a.inputs);

  std::optional<torch::stable::accelerator::DeviceGuard> guard;  // results are allocated on it too
  if (device.type == DeviceType::cuda) guard.emplace(device.index);
  std::vector<OwnedTensor> outputs;
  std::vector<TensorView> views;
  for (const OutputSpec& spec : results) {
    TensorView view{nullptr, spec.dtype, device, spec.shape, spec.strides};
    try {
      outputs.emplace_back(device.type == DeviceType::cpu && view.nbytes() >= kBackendAllocationBytes
                               ? from_backend_memory(*selection.backend, view, a.torch_device)
                               : torch_empty(view, a.torch_device));
    } catch (const Error& error) {
      fail_result_allocation(op, error);
    }
    check(aoti_torch_get_data_ptr(outputs.back().get(), &view.data), "aoti_torch_get_data_ptr");
    views.push_back(std::move(view));
  }
  launch(op, selection, a.inputs, views, device, a.torch_device);
  // torch takes over each result's reference from the stack.
  for (size_t i = 0; i < outputs.size(); ++i) stack[i] = torch::stable::detail::from(outputs[i].release());
}

void run_boxed_out(const OpDef& op, StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  const size_t count = static_cast<size_t>(op.schema().num_results);
  StackArgs a = read_stack(op, stack, num_args, count);
  OPFORGE_CHECK(num_outputs == 0, "torch called ", op.name(), ".out for ", num_outputs, " results");
  const Outputs results = infer_outputs(op, a.inputs);
  std::vector<std::optional<TensorView>> outs;
  std::vector<std::string> names;
  for (size_t i = 0; i < count; ++i) {
    names.push_back(out_name(i, count));
    std::pair<int32_t, int32_t> unused;
    outs.emplace_back(view_of(op, names.back(), a.held[op.schema().args.size() + i].get(), unused, &results[i]));
  }
  check_out(op, a.inputs, results, outs, names);
  const Selection selection = select_kernel(op, a.inputs);
  const Device device = device_of(a.inputs);
  std::optional<torch::stable::accelerator::DeviceGuard> guard;
  if (device.type == DeviceType::cuda) guard.emplace(device.index);
  std::vector<TensorView> views;
  for (auto& out : outs) views.push_back(std::move(*out));
  launch(op, selection, a.inputs, views, device, a.torch_device);
}

}  // namespace opforge::torch_adapter
