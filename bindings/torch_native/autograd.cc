// Autograd for every torch.ops.opforge op, in C++: the part of the torch adapter that LibTorch's
// stable ABI cannot express (it has no autograd API). Built against the full C++ API of the
// torch present at build time, so this library loads only on that torch version;
// python/opforge/torch.py checks the version first and otherwise registers the same rules in
// Python (torch.library.register_autograd), which costs several microseconds per call.
//
// One boxed kernel per op at the Autograd dispatch key, generic over the declaration:
// - no input needing a gradient: straight to the kernel below autograd (the common case, and
//   the reason this exists: a Python autograd kernel runs Python on every call);
// - otherwise: run below autograd (the op's declared saving forward instead, if it has one,
//   keeping its extra results), then attach a node that calls the declared backward op, its
//   arguments bound by name ("grad", "result", a saved result's name, or the forward argument
//   of that name), as python/opforge/torch.py and python/opforge/jax.py do.
//   "Below autograd" and the backward op are opforge's CPU kernel run straight on plain CPU
//   tensors (cpu_direct.h, as the direct call behind opforge.torch runs a forward) where nothing
//   else must see the call, and torch's dispatcher otherwise (other devices, FakeTensors, modes,
//   functorch, the tracer): the stable ABI's boxed hop costs microseconds a call. Gradients
//   declared as the cotangent itself (OpDef::identity_gradient) are handed through where the
//   input has the result's shape, and the backward op runs only if another is wanted, asked
//   (OpDef::output_mask_slot) for the wanted ones only. Arguments it reads only the shape
//   of (OpDef::shape_only) are kept as sizes, not tensors.
// Errors that opforge raised below (which the stable ABI turns into plain c10::Error) leave
// here as c10::TypeError / ValueError / NotImplementedError, so Python sees their real type.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bindings/torch_native/autocast.h"
#include "bindings/torch_native/cpu_direct.h"
#include "opforge/out.h"
#include "opforge/registry.h"

#define OPFORGE_TORCH_EXPORT extern "C" __attribute__((visibility("default")))

// In libopforge_torch.so (loaded first): the kind of an opforge error whose message `text`
// contains, or -1.
extern "C" int opforge_torch_error_kind(const char* text);

namespace opforge::torch_native {

namespace {

using torch::autograd::Edge;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// Where one argument of the backward op comes from.
struct Source {
  enum Kind { grad, result, forward_arg, saved_result, schema_default, output_mask } kind;
  size_t index = 0;  // forward_arg: among the forward op's schema arguments; saved_result: among its saved
};

// What the autograd kernel of one op needs, read once from its declaration.
struct Plan {
  std::string name;                  // "rms_norm"
  size_t num_args = 0;               // forward schema arguments
  size_t num_results = 1;
  std::vector<bool> is_tensor;       // per forward argument
  std::vector<bool> differentiable;  // per forward argument
  std::vector<bool> saved;           // per forward argument: the backward op reads it
  std::vector<bool> shape_only;      // per forward argument: ... but only its shape (OpDef::shape_only)
  std::vector<bool> identity;        // per forward argument: its gradient is the cotangent where it matches the result
  bool has_backward = false;
  bool saves_result = false;
  std::vector<Source> backward_args;              // per backward schema argument
  std::vector<size_t> gradient_of;                // backward result i -> forward argument index
  std::optional<c10::OperatorHandle> backward_op;  // defined with the forward op, before we load
  const OpDef* backward_def = nullptr;             // its opforge declaration
  const OpDef* forward_def = nullptr;              // the op's
  const OpDef* saving_def = nullptr;               // the saving forward's
  std::optional<c10::OperatorHandle> saving_op;    // run instead of the op when differentiating
  size_t num_saved = 0;                            // its results after the first
};

// Re-raises an error from below with the type opforge gave it. (The stable ABI hands kernel
// errors to torch as an error code; torch raises them again as std::runtime_error or c10::Error.)
[[noreturn]] void rethrow_typed(const std::exception& error) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
  const std::string message = c10_error ? c10_error->what_without_backtrace() : error.what();
  switch (opforge_torch_error_kind(message.c_str())) {
    case 0: TORCH_CHECK_TYPE(false, message);
    case 1: TORCH_CHECK_VALUE(false, message);
    case 2: TORCH_CHECK_NOT_IMPLEMENTED(false, message);
    default: throw;
  }
}

// An opforge error from a kernel run here, as the typed c10 error Python sees as its type.
[[noreturn]] void throw_typed(const Error& error) {
  switch (error.kind()) {
    case ErrorKind::type: TORCH_CHECK_TYPE(false, error.what());
    case ErrorKind::value: TORCH_CHECK_VALUE(false, error.what());
    case ErrorKind::not_implemented: TORCH_CHECK_NOT_IMPLEMENTED(false, error.what());
    case ErrorKind::runtime: break;
  }
  TORCH_CHECK(false, error.what());
}

void redispatch_below_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

std::atomic<uint64_t> direct_backward_calls{0};  // for the tests: whether this path is taken

// op's kernel straight on the stack's arguments from `start` on where they are plain CPU tensors
// and nothing else must see the call (cpu_direct.h): its results replace them, as the dispatcher
// leaves them. False, the stack untouched, where the dispatcher must run it: a dispatch mode,
// functorch transform or tracer (torch.compile's tracing of the backward), another device, and,
// unless called from op's own autograd kernel (below_autograd), a tensor that needs a gradient
// (a backward op under create_graph: its autograd kernel records the graph).
bool call_directly(const OpDef& op, torch::jit::Stack& stack, size_t start, bool below_autograd) {
  if (!thread_allows_direct(op)) return false;
  const std::optional<OpInputs> inputs =
      plain_inputs(op, c10::ArrayRef<c10::IValue>(stack).slice(start), below_autograd);
  if (!inputs) return false;
  std::vector<at::Tensor> results;
  try {
    // Without the GIL: the engine runs backward ops without it, and the dispatcher's callers
    // (torch's Python bindings) release it.
    results = run_on_cpu(op, *inputs, /*holds_gil=*/false);
  } catch (const Error& error) {
    throw_typed(error);
  }
  stack.erase(stack.begin() + static_cast<std::ptrdiff_t>(start), stack.end());
  for (at::Tensor& r : results) stack.emplace_back(std::move(r));
  return true;
}

// op below autograd: its kernel straight where call_directly can, else the dispatcher's next keys.
void run_below_autograd(const OpDef& def, const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                        torch::jit::Stack* stack, size_t start) {
  if (!call_directly(def, *stack, start, /*below_autograd=*/true)) redispatch_below_autograd(op, keys, stack);
}

void redispatch_below_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  at::AutoDispatchBelowADInplaceOrView guard;
  try {
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  } catch (const std::exception& error) {
    rethrow_typed(error);
  }
}

// torch 2.13 holds autograd nodes in c10::intrusive_ptr, older versions in std::shared_ptr;
// this library builds against either (templates, so only the matching branch is compiled).
template <class N>
constexpr bool kIntrusiveNodes = std::is_base_of_v<c10::intrusive_ptr_target, N>;

template <class N, class... Args>
auto make_node(Args&&... args) {
  if constexpr (kIntrusiveNodes<N>)
    return c10::make_intrusive<N>(std::forward<Args>(args)...);
  else
    return std::make_shared<N>(std::forward<Args>(args)...);
}

template <class N>
auto owning_pointer(N* node) {
  if constexpr (kIntrusiveNodes<N>)
    return node->getptr();
  else
    return node->shared_from_this();
}

class OpforgeBackward final : public torch::autograd::Node {
 public:
  explicit OpforgeBackward(std::shared_ptr<Plan> plan)
      : plan_(std::move(plan)), inputs_(plan_->num_args), passes_(plan_->num_args, false) {}

  std::string name() const override { return "opforge::" + plan_->name + "Backward"; }

  void save_inputs(const torch::jit::Stack& stack, size_t start) {
    for (size_t i = 0; i < plan_->num_args; ++i) {
      const c10::IValue& value = stack[start + i];
      if (!plan_->saved[i]) continue;
      if (plan_->is_tensor[i] && value.isTensor() && plan_->shape_only[i]) {
        const at::Tensor& t = value.toTensor();
        shapes_.push_back({i, t.sym_sizes().vec(), t.options()});
      } else if (plan_->is_tensor[i]) {
        if (value.isTensor()) tensors_.emplace_back(i, SavedVariable(value.toTensor(), /*is_output=*/false));
      } else {
        inputs_[i] = value;
      }
    }
  }
  void save_result(const at::Tensor& result) { result_ = SavedVariable(result, /*is_output=*/true); }
  // Forward argument i's gradient is the cotangent itself (OpDef::identity_gradient, and it has
  // the result's shape and dtype).
  void pass_through(size_t i) { passes_[i] = true; }
  // The saving forward's extra results: not outputs of this node (nothing differentiates them).
  void save_extra(const at::Tensor& value) { extra_.emplace_back(value, /*is_output=*/false); }

  variable_list apply(variable_list&& grads) override {
    const Plan& plan = *plan_;
    TORCH_CHECK(plan.has_backward, plan.name, "() is not differentiable: its declaration names no backward op");
    for (size_t i = 1; i < grads.size(); ++i)
      TORCH_CHECK_NOT_IMPLEMENTED(!grads[i].defined(), plan.name,
                                  "(): backward through an op with several results is not supported yet");
    // An unused result's cotangent arrives undefined; the backward op wants zeros.
    at::Tensor grad = grads[0].defined() ? grads[0] : input_metadata(0).zeros_like();
    // One gradient per next edge (the forward op's tensor arguments, in order).
    variable_list out;
    std::vector<int64_t> edge_of_arg(plan.num_args, -1);
    bool need_op = false;  // some wanted gradient is not the cotangent
    for (size_t i = 0; i < plan.num_args; ++i)
      if (plan.is_tensor[i]) {
        edge_of_arg[i] = static_cast<int64_t>(out.size());
        out.emplace_back();
        if (!task_should_compute_output(static_cast<size_t>(edge_of_arg[i]))) continue;
        if (passes_[i])
          out.back() = grad;
        else if (plan.differentiable[i])
          need_op = true;
      }
    if (need_op) run_backward_op(grad, edge_of_arg, out);
    return out;
  }

 private:
  // The declared backward op through torch's dispatcher; fills the wanted gradients not
  // already the cotangent.
  void run_backward_op(const at::Tensor& grad, const std::vector<int64_t>& edge_of_arg, variable_list& out) {
    const Plan& plan = *plan_;
    std::vector<c10::IValue> forward(plan.num_args);
    for (size_t i = 0; i < plan.num_args; ++i) forward[i] = inputs_[i];
    for (const auto& [i, saved] : tensors_) forward[i] = saved.unpack(owning_pointer<torch::autograd::Node>(this));
    // A stand-in with the shape and no storage: one element broadcast (symbolic sizes under torch.compile).
    for (const auto& s : shapes_) forward[s.arg] = at::empty({}, s.options).expand_symint(s.sizes);

    // The backward op's results autograd wants (OpDef::output_mask_slot): not a gradient that is
    // the cotangent, nor one of an input needing none (the first layer's x, a frozen weight).
    int64_t mask = 0;
    for (size_t r = 0; r < plan.gradient_of.size(); ++r) {
      const size_t i = plan.gradient_of[r];
      if (!passes_[i] && task_should_compute_output(static_cast<size_t>(edge_of_arg[i]))) mask |= int64_t{1} << r;
    }

    const auto& schema = plan.backward_op->schema();
    torch::jit::Stack stack;
    stack.reserve(schema.arguments().size());
    for (size_t a = 0; a < plan.backward_args.size(); ++a) {
      const Source& source = plan.backward_args[a];
      switch (source.kind) {
        case Source::grad: stack.emplace_back(grad); break;
        case Source::result: stack.emplace_back(result_.unpack(owning_pointer<torch::autograd::Node>(this))); break;
        case Source::forward_arg: stack.emplace_back(forward[source.index]); break;
        case Source::saved_result:
          stack.emplace_back(extra_[source.index].unpack(owning_pointer<torch::autograd::Node>(this)));
          break;
        case Source::schema_default: stack.emplace_back(*schema.arguments()[a].default_value()); break;
        case Source::output_mask: stack.emplace_back(mask); break;
      }
    }
    if (call_directly(*plan.backward_def, stack, 0, /*below_autograd=*/false)) {
      direct_backward_calls.fetch_add(1, std::memory_order_relaxed);
    } else {
      try {
        plan.backward_op->callBoxed(stack);
      } catch (const std::exception& error) {
        rethrow_typed(error);
      }
    }
    for (size_t r = 0; r < plan.gradient_of.size() && r < stack.size(); ++r) {
      const size_t i = plan.gradient_of[r];
      if (!passes_[i] && task_should_compute_output(static_cast<size_t>(edge_of_arg[i])))
        out[edge_of_arg[i]] = stack[r].toTensor();
    }
  }

 protected:
  void release_variables() override {
    tensors_.clear();
    shapes_.clear();
    extra_.clear();
    result_.reset_data();
  }

 private:
  std::shared_ptr<Plan> plan_;
  std::vector<c10::IValue> inputs_;  // non-tensor arguments the backward op reads
  std::vector<std::pair<size_t, SavedVariable>> tensors_;
  struct Shape {  // a tensor argument the backward op reads only the shape of
    size_t arg;
    std::vector<c10::SymInt> sizes;
    at::TensorOptions options;
  };
  std::vector<Shape> shapes_;
  SavedVariable result_;
  std::vector<SavedVariable> extra_;  // the saving forward's extra results, in declaration order
  std::vector<bool> passes_;          // per forward argument: its gradient is the cotangent
};

bool any_requires_grad(const Plan& plan, const torch::jit::Stack& stack, size_t start) {
  if (!at::GradMode::is_enabled()) return false;
  for (size_t i = 0; i < plan.num_args; ++i) {
    const c10::IValue& value = stack[start + i];
    if (plan.is_tensor[i] && value.isTensor() && value.toTensor().requires_grad()) return true;
  }
  return false;
}

// Forward-mode AD (dual tensors: torch.func.jvp, jacfwd, forward_ad) would otherwise drop the
// tangents silently below this kernel: opforge declares reverse-mode backward ops only.
void refuse_forward_ad(const Plan& plan, const torch::jit::Stack& stack, size_t start) {
  for (size_t i = 0; i < plan.num_args; ++i) {
    const c10::IValue& value = stack[start + i];
    if (plan.is_tensor[i] && value.isTensor() && value.toTensor()._fw_grad(/*level=*/0).defined())
      TORCH_CHECK_NOT_IMPLEMENTED(false, plan.name,
                                  "(): forward-mode AD (jvp, jacfwd, dual tensors) is not supported: ",
                                  "opforge ops have reverse-mode backward ops only");
  }
}

// The Autograd kernel of one op (a functor: a plain boxed function could not tell which op).
class AutogradKernel final : public c10::OperatorKernel {
 public:
  explicit AutogradKernel(std::shared_ptr<Plan> plan) : plan_(std::move(plan)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    const Plan& plan = *plan_;
    const size_t start = stack->size() - plan.num_args;
    refuse_forward_ad(plan, *stack, start);
    if (!any_requires_grad(plan, *stack, start)) return run_below_autograd(*plan.forward_def, op, keys, stack, start);

    // Edges to every tensor argument's gradient; none for arguments declared not differentiable
    // (they get no gradient, as in the declaration) or absent (None).
    auto node = make_node<OpforgeBackward>(plan_);
    torch::autograd::edge_list edges;
    std::vector<size_t> wanted;  // forward arguments whose gradient is wanted
    for (size_t i = 0; i < plan.num_args; ++i) {
      if (!plan.is_tensor[i]) continue;
      const c10::IValue& value = (*stack)[start + i];
      // An op with no backward op gets edges to every input needing a gradient, so that the
      // engine reaches its node (which raises) instead of treating the result as a constant.
      const bool want = (plan.differentiable[i] || !plan.has_backward) && value.isTensor() &&
                        value.toTensor().requires_grad();
      edges.push_back(want ? torch::autograd::impl::gradient_edge(value.toTensor()) : Edge());
      if (want) wanted.push_back(i);
    }
    node->set_next_edges(std::move(edges));
    // The arguments, kept before the call consumes them: what to save depends on the result.
    const torch::jit::Stack arguments(stack->begin() + static_cast<std::ptrdiff_t>(start), stack->end());

    // The saving forward takes the same arguments and returns the op's result first; its other
    // results are kept for the backward op and dropped from the stack.
    if (plan.saving_op) run_below_autograd(*plan.saving_def, *plan.saving_op, keys, stack, start);
    else run_below_autograd(*plan.forward_def, op, keys, stack, start);
    const size_t first_result = stack->size() - plan.num_saved - plan.num_results;
    const at::Tensor result = (*stack)[first_result].toTensor();

    // Gradients that are the cotangent itself need nothing saved; if all wanted ones are, the
    // backward op never runs and the node keeps no tensor alive (torch's AddBackward neither).
    bool need_op = false;
    for (size_t i : wanted) {
      const at::Tensor& input = arguments[i].toTensor();
      if (plan.identity[i] && input.sym_sizes() == result.sym_sizes() && input.scalar_type() == result.scalar_type())
        node->pass_through(i);
      else
        need_op = true;
    }
    if (need_op) {
      node->save_inputs(arguments, 0);
      for (size_t s = 0; s < plan.num_saved; ++s)
        node->save_extra((*stack)[stack->size() - plan.num_saved + s].toTensor());
    }
    stack->resize(stack->size() - plan.num_saved);

    for (size_t r = 0; r < plan.num_results; ++r) {
      at::Tensor out = (*stack)[first_result + r].toTensor();
      if (!torch::autograd::isDifferentiableType(out.scalar_type())) continue;
      torch::autograd::set_history(out, node);
      if (r == 0 && plan.saves_result && need_op) node->save_result(out);
    }
  }

 private:
  std::shared_ptr<Plan> plan_;
};

// The Autograd kernel of an op's out variant (opforge/out.h). As torch's own out= variants, no
// autograd through it: a tensor that needs a gradient is refused (TypeError, the words of
// opforge's other paths). Below autograd, its kernel straight on plain CPU tensors (write_on_cpu)
// or the dispatcher's next keys; either way each out's version counter is bumped after the
// write, as torch's in-place ops do, so autograd refuses a value it saved before it.
class OutAutogradKernel final : public c10::OperatorKernel {
 public:
  explicit OutAutogradKernel(const OpDef& op) : op_(op) {}

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    const size_t num_args = op_.schema().args.size(), count = static_cast<size_t>(op_.schema().num_results);
    const size_t start = stack->size() - num_args - count;
    if (at::GradMode::is_enabled())
      for (size_t i = 0; i < num_args + count; ++i) {
        const c10::IValue& value = (*stack)[start + i];
        if (!value.isTensor() || !value.toTensor().requires_grad()) continue;
        try {
          fail_out_needs_grad(op_, i < num_args ? op_.schema().args[i].name : out_name(i - num_args, count));
        } catch (const Error& error) {
          throw_typed(error);
        }
      }
    std::vector<at::Tensor> outs;
    bool plain_outs = true;
    for (size_t i = 0; i < count; ++i) {
      outs.push_back((*stack)[start + num_args + i].toTensor());
      plain_outs = plain_outs && plain_cpu(outs.back());
    }
    const std::optional<OpInputs> inputs =
        plain_outs && thread_allows_direct(op_)
            ? plain_inputs(op_, c10::ArrayRef<c10::IValue>(*stack).slice(start, num_args), /*below_autograd=*/true)
            : std::nullopt;
    if (!inputs) {
      redispatch_below_autograd(handle, keys, stack);
      for (const at::Tensor& t : outs) t.unsafeGetTensorImpl()->bump_version();
      return;
    }
    try {
      write_on_cpu(op_, *inputs, outs, /*holds_gil=*/false);  // bumps the versions itself
    } catch (const Error& error) {
      throw_typed(error);
    }
    stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(start), stack->end());
  }

 private:
  const OpDef& op_;
};

// Reads `op`'s declaration into a Plan; throws (caught by the caller) if the backward op cannot
// be bound, which opforge's own registry has already checked.
std::shared_ptr<Plan> make_plan(const OpDef& op) {
  auto plan = std::make_shared<Plan>();
  const auto& args = op.schema().args;
  plan->name = op.name();
  plan->forward_def = &op;
  plan->num_args = args.size();
  plan->num_results = static_cast<size_t>(op.schema().num_results);
  plan->is_tensor.resize(args.size());
  plan->differentiable.resize(args.size());
  plan->saved.resize(args.size());
  plan->shape_only.resize(args.size());
  plan->identity.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) plan->is_tensor[i] = args[i].is_tensor();
  if (op.backward_op().empty()) return plan;

  plan->has_backward = true;
  for (const std::string& name : op.differentiable()) {
    const int64_t i = op.schema().arg_index(name);
    TORCH_CHECK(i >= 0, op.name(), "() declares a gradient for '", name, "', which it does not take");
    plan->differentiable[i] = true;
    plan->gradient_of.push_back(static_cast<size_t>(i));
  }
  for (const std::string& name : op.identity_inputs()) plan->identity[op.schema().arg_index(name)] = true;
  plan->backward_op = c10::Dispatcher::singleton().findSchemaOrThrow(("opforge::" + op.backward_op()).c_str(), "");
  const OpDef* bwd_def = lookup_op(op.backward_op());
  TORCH_CHECK(bwd_def, op.name(), "(): backward op '", op.backward_op(), "' is not registered with opforge");
  plan->backward_def = bwd_def;
  const std::vector<std::string>& saved = op.saved();
  if (!op.saving_op().empty()) {
    plan->saving_op = c10::Dispatcher::singleton().findSchemaOrThrow(("opforge::" + op.saving_op()).c_str(), "");
    plan->saving_def = lookup_op(op.saving_op());
    TORCH_CHECK(plan->saving_def, op.name(), "(): saving op '", op.saving_op(), "' is not registered with opforge");
    plan->num_saved = saved.size();
  }
  for (const c10::Argument& arg : plan->backward_op->schema().arguments()) {
    const int64_t i = op.schema().arg_index(arg.name());
    const auto saved_at = std::find(saved.begin(), saved.end(), arg.name());
    if (arg.name() == "grad") {
      plan->backward_args.push_back({Source::grad});
    } else if (arg.name() == "output_mask" && bwd_def->output_mask_slot() >= 0) {
      plan->backward_args.push_back({Source::output_mask});
    } else if (arg.name() == "result") {
      plan->backward_args.push_back({Source::result});
      plan->saves_result = true;
    } else if (i >= 0) {
      plan->backward_args.push_back({Source::forward_arg, static_cast<size_t>(i)});
      plan->saved[i] = true;
      const auto& shape_only = bwd_def->shape_only_args();
      plan->shape_only[i] = std::find(shape_only.begin(), shape_only.end(), arg.name()) != shape_only.end();
    } else if (saved_at != saved.end() && plan->saving_op) {
      plan->backward_args.push_back({Source::saved_result, static_cast<size_t>(saved_at - saved.begin())});
    } else {
      TORCH_CHECK(arg.default_value().has_value(), op.backward_op(), "() takes '", arg.name(), "', which ", op.name(),
                  "() cannot supply");
      plan->backward_args.push_back({Source::schema_default});
    }
  }
  return plan;
}

std::string& load_errors() {
  static std::string errors;
  return errors;
}

// Ops given their Autograd kernels (the op's, its out variant's) so far, by name.
std::set<std::string>& implemented() {
  static std::set<std::string> names;
  return names;
}

// Registers the Autograd kernel of every op that has none yet (all of them while this library
// loads; a plugin's, later). A failure is recorded, never thrown: throwing from a static
// initializer would abort the process.
void implement_new(torch::Library& m, std::string& errors) {
  for (const opforge::OpDef* op : opforge::all_ops()) {
    if (!implemented().insert(op->name()).second) continue;
    try {
      m.impl(op->name().c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AutogradKernel>(make_plan(*op))));
      if (!out_variant_schema(*op).empty())
        m.impl((op->name() + ".out").c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<OutAutogradKernel>(*op)));
    } catch (const std::exception& e) {
      errors += "autograd kernel of '" + op->name() + "': " + e.what() + "\n";
    }
  }
}

}  // namespace

}  // namespace opforge::torch_native

// Every op opforge registered with torch (libopforge_torch.so, loaded before this library,
// defined them all) gets its Autograd kernel.
TORCH_LIBRARY_IMPL(opforge, Autograd, m) {
  opforge::torch_native::implement_new(m, opforge::torch_native::load_errors());
}

// ... and, for the ops that declare a cast policy, their autocast kernels (one library for the
// three autocast keys, so it has none of its own; never destroyed, like the registrations).
[[maybe_unused]] static const bool opforge_autocast_registered = [] {
  opforge::torch_native::implement_autocast(
      *new torch::Library(torch::Library::IMPL, "opforge", std::nullopt, __FILE__, __LINE__),
      opforge::torch_native::load_errors());
  return true;
}();

// How many backward ops autograd nodes have run straight on plain CPU tensors (call_directly).
OPFORGE_TORCH_EXPORT uint64_t opforge_torch_native_direct_backward_calls() {
  return opforge::torch_native::direct_backward_calls.load(std::memory_order_relaxed);
}

// Empty when every op got its kernel; otherwise one line per problem (opforge.torch raises it).
OPFORGE_TORCH_EXPORT const char* opforge_torch_native_registration_errors() {
  return opforge::torch_native::load_errors().c_str();
}

// The Autograd kernels of the ops defined since this library loaded (a plugin loaded later:
// libopforge_torch.so has defined them first). Returns "" or this call's problems. The library
// made here is never destroyed: its registrations last as long as it does.
OPFORGE_TORCH_EXPORT const char* opforge_torch_native_register_new_ops() {
  using namespace opforge::torch_native;
  static std::mutex mutex;
  static std::string errors;
  std::lock_guard lock(mutex);
  errors.clear();
  implement_new(*new torch::Library(torch::Library::IMPL, "opforge", c10::DispatchKey::Autograd, __FILE__, __LINE__),
                errors);
  implement_autocast(*new torch::Library(torch::Library::IMPL, "opforge", std::nullopt, __FILE__, __LINE__), errors);
  return errors.c_str();
}
