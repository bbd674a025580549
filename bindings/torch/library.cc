// Registers every opforge op with torch's dispatcher: torch.ops.opforge.<op>, defined from
// the op's schema (opforge schemas are torch syntax), and its out variant
// torch.ops.opforge.<op>.out (opforge/out.h), with boxed kernels for the CPU and CUDA dispatch
// keys. Nothing here names an op.
//
// A boxed kernel is a bare function pointer: torch passes it no context, so it cannot be told
// which op it runs. Each op therefore gets its own instantiation of a small template whose
// parameter is the op's index; a table holds kMaxOps of them. Ops a plugin adds after this
// library loaded get the next indices (opforge_torch_register_new_ops).
#include <array>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "call.h"
#include "opforge/out.h"
#include "opforge/registry.h"

#define OPFORGE_TORCH_EXPORT extern "C" __attribute__((visibility("default")))

namespace opforge::torch_adapter {

namespace {

constexpr int kMaxOps = 256;
using BoxedFn = void (*)(StableIValue*, uint64_t, uint64_t);
using torch::stable::detail::StableLibrary;

// The ops torch knows, by index. Filled while this library loads (the ops' registrars in
// libopforge.so have run by then) and again by opforge_torch_register_new_ops for ops a plugin
// added later. A slot is written before torch can call its kernel and never changes after.
struct Defined {
  std::array<const OpDef*, kMaxOps> ops{};
  std::array<bool, kMaxOps> has_out{};  // torch took the op's out variant
  size_t count = 0;
  std::set<std::string, std::less<>> names;  // tried, whether torch took the schema or not
  std::mutex mutex;                           // one registration at a time
};

Defined& defined() {
  static Defined d;
  return d;
}

// What went wrong while this library loaded; Python raises it as an ImportError. Nothing may
// throw out of a static initializer: that would abort the process.
std::string& load_errors() {
  static std::string errors;
  return errors;
}

// The boxed kernel of op I: `run` (the op, or its out variant) with the error's kind remembered.
template <int I, void (*run)(const OpDef&, StableIValue*, uint64_t, uint64_t)>
void boxed(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  try {
    run(*defined().ops[I], stack, num_args, num_outputs);
  } catch (const Error& e) {
    remember_error(e);
    throw;
  }
}

template <void (*run)(const OpDef&, StableIValue*, uint64_t, uint64_t), int... I>
constexpr std::array<BoxedFn, sizeof...(I)> make_trampolines(std::integer_sequence<int, I...>) {
  return {&boxed<I, run>...};
}
constexpr auto kTrampolines = make_trampolines<&run_boxed>(std::make_integer_sequence<int, kMaxOps>{});
constexpr auto kOutTrampolines = make_trampolines<&run_boxed_out>(std::make_integer_sequence<int, kMaxOps>{});

// The registered ops torch has not been given yet.
std::vector<const OpDef*> new_ops() {
  std::vector<const OpDef*> out;
  for (const OpDef* op : all_ops())
    if (!defined().names.count(op->name())) out.push_back(op);
  return out;
}

// Defines `ops` in `m`; returns the index of the first one defined (the others follow it).
size_t define(StableLibrary& m, const std::vector<const OpDef*>& ops, std::string& errors) {
  Defined& d = defined();
  const size_t first = d.count;
  for (const OpDef* op : ops) {
    d.names.insert(op->name());
    if (d.count == kMaxOps) {
      errors += str("opforge.torch supports at most ", kMaxOps, " ops (raise kMaxOps in bindings/torch/library.cc); '",
                    op->name(), "' is not registered\n");
      continue;
    }
    try {
      m.def(op->schema().text.c_str());
    } catch (const std::exception& e) {
      errors += str("torch rejected the schema of '", op->name(), "' (", op->schema().text, "): ", e.what(), "\n");
      continue;
    }
    const std::string out_schema = out_variant_schema(*op);
    try {
      if (!out_schema.empty()) m.def(out_schema.c_str());
      d.has_out[d.count] = !out_schema.empty();
    } catch (const std::exception& e) {
      errors += str("torch rejected the out variant of '", op->name(), "' (", out_schema, "): ", e.what(), "\n");
    }
    d.ops[d.count++] = op;
  }
  return first;
}

void implement(StableLibrary& m, const char* key, size_t first, std::string& errors) {
  Defined& d = defined();
  for (size_t i = first; i < d.count; ++i) {
    try {
      m.impl(d.ops[i]->name().c_str(), kTrampolines[i]);
      if (d.has_out[i]) m.impl((d.ops[i]->name() + ".out").c_str(), kOutTrampolines[i]);
    } catch (const std::exception& e) {
      errors += str("registering the ", key, " kernel of '", d.ops[i]->name(), "' failed: ", e.what(), "\n");
    }
  }
}

size_t first_at_load = 0;  // the load-time blocks below define, then implement, the same ops

}  // namespace

}  // namespace opforge::torch_adapter

// Run in this order while the library loads (one translation unit initializes top to bottom).
STABLE_TORCH_LIBRARY(opforge, m) {
  using namespace opforge::torch_adapter;
  first_at_load = define(m, new_ops(), load_errors());
}
// CPU and CUDA tensors both reach the same kernel; opforge's dispatcher picks the backend by
// the tensors' device. Registering CUDA is harmless on a CPU-only torch.
STABLE_TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  opforge::torch_adapter::implement(m, "CPU", opforge::torch_adapter::first_at_load, opforge::torch_adapter::load_errors());
}
STABLE_TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  opforge::torch_adapter::implement(m, "CUDA", opforge::torch_adapter::first_at_load, opforge::torch_adapter::load_errors());
}

// Gives torch the ops registered since (a plugin loaded after this library: opforge.load_plugin)
// and their CPU and CUDA kernels. Returns "" or one line per problem, for this call only. The
// libraries made here are never destroyed: their registrations last as long as they do.
OPFORGE_TORCH_EXPORT const char* opforge_torch_register_new_ops() {
  using namespace opforge::torch_adapter;
  static std::string errors;
  std::lock_guard lock(defined().mutex);
  errors.clear();
  const std::vector<const opforge::OpDef*> ops = new_ops();
  if (ops.empty()) return errors.c_str();
  const size_t first = define(*new StableLibrary(StableLibrary::Kind::FRAGMENT, "opforge", nullptr, __FILE__, __LINE__),
                              ops, errors);
  implement(*new StableLibrary(StableLibrary::Kind::IMPL, "opforge", "CPU", __FILE__, __LINE__), "CPU", first, errors);
  implement(*new StableLibrary(StableLibrary::Kind::IMPL, "opforge", "CUDA", __FILE__, __LINE__), "CUDA", first, errors);
  return errors.c_str();
}

// Empty when every op registered; otherwise one line per problem.
OPFORGE_TORCH_EXPORT const char* opforge_torch_registration_errors() {
  return opforge::torch_adapter::load_errors().c_str();
}

// The opforge::ErrorKind (0 type, 1 value, 2 not implemented, 3 runtime) of a recent error whose
// message `text` contains, or -1. torch raises every kernel error as RuntimeError; opforge.torch
// uses this to raise TypeError, ValueError or NotImplementedError instead.
OPFORGE_TORCH_EXPORT int opforge_torch_error_kind(const char* text) {
  return opforge::torch_adapter::error_kind(text);
}
