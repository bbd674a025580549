// torch.ops.opforge.<op> and its out variant on forge tensors, natively (no CPU fallback): one
// boxed kernel for every op, generic over its declaration. Arguments are validated and results
// allocated (or the outs checked) on the calling thread, so bad input raises at the call; the
// kernel itself, opforge's CPU kernel run on forge memory presented as cpu TensorViews, is
// queued on the current forge stream.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <mutex>
#include <set>
#include <string>

#include "bindings/common/aten_dtype.h"
#include "opforge/dispatch.h"
#include "opforge/out.h"
#include "opforge/registry.h"
#include "runtime.h"

namespace opforge::forge {

namespace {

using aten::dtype_of;
using aten::scalar_type_of;

std::string device_text(const at::Tensor& t) {
  return t.is_privateuseone() ? "forge:" + std::to_string(t.device().index()) : t.device().str();
}

// Where the tensors must all live, and their views; errors name the op and the argument.
struct Bound {
  OpInputs inputs;
  std::vector<at::Tensor> keep;  // alive until the queued kernel has run
  int device = -1;
};

// The op's arguments, the last `n` on the stack (an out variant's outs already taken off).
Bound bind(const OpDef& op, torch::jit::Stack& stack, size_t n) {
  const auto& specs = op.schema().args;
  TORCH_CHECK(n == specs.size(), "forge: torch passed ", n, " arguments to ", op.name(), ", expected ", specs.size());
  auto args = torch::jit::last(stack, n);
  Bound b{OpInputs::reserved_for(op.schema())};
  std::string first;  // the argument that fixed the device
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = args[i];
    const ArgSpec& spec = specs[i];
    switch (spec.kind) {
      case ArgKind::tensor:
      case ArgKind::optional_tensor: {
        if (v.isNone()) {
          b.inputs.tensors.emplace_back(std::nullopt);
          break;
        }
        const at::Tensor& t = v.toTensor();
        if (!t.is_privateuseone() || (b.device >= 0 && t.device().index() != b.device))
          fail(ErrorKind::runtime, op.name(), "(): '", spec.name, "' is on ", device_text(t), " but ",
               first.empty() ? std::string("the op runs on forge") : "'" + first + "' is on forge:" + std::to_string(b.device),
               "; every tensor of an opforge op on forge must be on the same forge device (use .to())");
        if (b.device < 0) {
          b.device = t.device().index();
          first = spec.name;
        }
        const auto dtype = dtype_of(t.scalar_type());
        if (!dtype) fail_unsupported_dtype(op, spec.name, aten::python_name_of(t.scalar_type()));
        // Forge memory is host memory: opforge's CPU backend runs on it (from a stream's worker).
        b.inputs.tensors.emplace_back(TensorView{t.data_ptr(), *dtype, Device{DeviceType::cpu, 0},
                                                 t.sizes().vec(), t.strides().vec()});
        b.keep.push_back(t);
        break;
      }
      case ArgKind::float_: b.inputs.attrs.emplace_back(v.toDouble()); break;
      case ArgKind::int_: b.inputs.attrs.emplace_back(v.toInt()); break;
      case ArgKind::bool_: b.inputs.attrs.emplace_back(v.toBool()); break;
      case ArgKind::str: b.inputs.attrs.emplace_back(v.toStringRef()); break;
    }
  }
  torch::jit::drop(stack, n);
  if (b.device < 0) b.device = current_device();
  return b;
}

// Queues the kernel on the current forge stream, writing `views` (over `results`); the inputs and
// results stay alive, and readable by host code, until it has run.
void enqueue(const OpDef& op, const Selection& selection, Bound&& b, std::vector<TensorView> views,
             const std::vector<at::Tensor>& results) {
  std::vector<at::Tensor> keep = std::move(b.keep);
  keep.insert(keep.end(), results.begin(), results.end());
  current_stream(b.device).enqueue([&op, selection, inputs = std::move(b.inputs), views = std::move(views),
                                    keep = std::move(keep)] {
    HostAccess access;
    for (const at::Tensor& t : keep) access.add(t);
    run_kernel(op, selection, inputs, views, nullptr);
  });
}

void run(const OpDef& op, const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
  Bound b = bind(op, *stack, schema.arguments().size());
  const Outputs results = infer_outputs(op, b.inputs);
  const Selection selection = select_kernel(op, b.inputs);
  std::vector<at::Tensor> outputs;
  std::vector<TensorView> views;
  const auto where = at::TensorOptions().device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(b.device));
  for (const OutputSpec& spec : results) {
    outputs.push_back(at::empty_strided(spec.shape, spec.strides, where.dtype(scalar_type_of(spec.dtype))));
    views.push_back(TensorView{outputs.back().data_ptr(), spec.dtype, Device{DeviceType::cpu, 0}, spec.shape,
                               spec.strides});
  }
  enqueue(op, selection, std::move(b), std::move(views), outputs);
  for (at::Tensor& t : outputs) stack->push_back(std::move(t));
}

// The out variant (opforge/out.h): the op's arguments, then one forge tensor per result, which
// the kernel writes on the current stream; nothing is returned.
void run_out(const OpDef& op, const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
  const size_t count = static_cast<size_t>(op.schema().num_results);
  TORCH_CHECK(schema.arguments().size() == op.schema().args.size() + count, "forge: torch passed ",
              schema.arguments().size(), " arguments to ", op.name(), ".out");
  std::vector<at::Tensor> outs;
  for (const c10::IValue& v : torch::jit::last(*stack, count)) outs.push_back(v.toTensor());
  torch::jit::drop(*stack, count);
  Bound b = bind(op, *stack, op.schema().args.size());
  const Outputs results = infer_outputs(op, b.inputs);
  std::vector<std::optional<TensorView>> views;
  std::vector<std::string> names;
  for (size_t i = 0; i < count; ++i) {
    names.push_back(out_name(i, count));
    const at::Tensor& t = outs[i];
    if (!t.is_privateuseone() || t.device().index() != b.device)
      fail(ErrorKind::runtime, op.name(), "(): '", names.back(), "' is on ", device_text(t),
           " but the op runs on forge:", b.device, "; every tensor of an opforge op on forge must be on the same "
           "forge device (use .to())");
    const auto dtype = dtype_of(t.scalar_type());
    if (!dtype)
      fail(ErrorKind::type, op.name(), "(): '", names.back(), "' must have dtype ", dtype_name(results[i].dtype),
           ", got ", aten::python_name_of(t.scalar_type()));
    views.emplace_back(TensorView{t.data_ptr(), *dtype, Device{DeviceType::cpu, 0}, t.sizes().vec(), t.strides().vec()});
  }
  check_out(op, b.inputs, results, views, names);
  const Selection selection = select_kernel(op, b.inputs);
  std::vector<TensorView> written;
  for (auto& view : views) written.push_back(std::move(*view));
  enqueue(op, selection, std::move(b), std::move(written), outs);
}

// opforge's errors become torch's typed errors, which Python raises as TypeError, ValueError,
// NotImplementedError or RuntimeError with opforge's message.
void boxed(const c10::OperatorHandle& handle, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = handle.schema();
  std::string_view name = schema.name();
  name.remove_prefix(name.find("::") + 2);
  const OpDef* op = lookup_op(name);
  TORCH_CHECK(op, "forge: torch.ops.opforge.", name, " is not an opforge op known to this build");
  try {
    if (schema.overload_name() == "out")
      run_out(*op, schema, stack);
    else
      run(*op, schema, stack);
  } catch (const Error& e) {
    switch (e.kind()) {
      case ErrorKind::type: TORCH_CHECK_TYPE(false, e.what());
      case ErrorKind::value: TORCH_CHECK_VALUE(false, e.what());
      case ErrorKind::not_implemented: TORCH_CHECK_NOT_IMPLEMENTED(false, e.what());
      case ErrorKind::runtime: TORCH_CHECK(false, e.what());
    }
  }
}

}  // namespace

std::string& op_registration_errors() {
  static auto* errors = new std::string();
  return *errors;
}

namespace {

// Registers the forge kernel of every op that has none yet: all of them while this library
// loads, a plugin's later. Never throws: a failure is recorded for Python to raise.
void implement_new(torch::Library& m, std::string& errors) {
  static auto* implemented = new std::set<std::string>();
  for (const OpDef* op : all_ops()) {
    if (!implemented->insert(op->name()).second) continue;
    try {
      m.impl(op->name().c_str(), torch::CppFunction::makeFromBoxedFunction<&boxed>());
      if (!out_variant_schema(*op).empty())
        m.impl((op->name() + ".out").c_str(), torch::CppFunction::makeFromBoxedFunction<&boxed>());
    } catch (const std::exception& e) {
      errors += "registering " + op->name() + " for forge failed: " + e.what() + "\n";
    }
  }
}

}  // namespace

// The forge kernels of the ops a plugin added after this library loaded. Returns "" or this
// call's problems; the library made here is never destroyed (its registrations die with it).
const char* register_new_ops() {
  static std::mutex mutex;
  static auto* errors = new std::string();
  std::lock_guard lock(mutex);
  errors->clear();
  implement_new(*new torch::Library(torch::Library::IMPL, "opforge", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__),
                *errors);
  return errors->c_str();
}

}  // namespace opforge::forge

// Registered by name before libopforge_torch.so defines the ops (torch accepts an impl ahead
// of its def), so loading this library does not depend on the order.
TORCH_LIBRARY_IMPL(opforge, PrivateUse1, m) {
  opforge::forge::implement_new(m, opforge::forge::op_registration_errors());
}
