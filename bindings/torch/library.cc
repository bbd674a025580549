// Registers every opforge op with torch's dispatcher: torch.ops.opforge.<op>, defined from
// the op's schema (opforge schemas are torch syntax), with one boxed kernel per op for the
// CPU and CUDA dispatch keys. Nothing here names an op.
//
// A boxed kernel is a bare function pointer: torch passes it no context, so it cannot be told
// which op it runs. Each op therefore gets its own instantiation of a small template whose
// parameter is the op's index; a table holds kMaxOps of them.
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "call.h"
#include "opforge/registry.h"

#define OPFORGE_TORCH_EXPORT extern "C" __attribute__((visibility("default")))

namespace opforge::torch_adapter {

namespace {

constexpr int kMaxOps = 256;
using BoxedFn = void (*)(StableIValue*, uint64_t, uint64_t);

// The ops torch knows, by index. Filled once, while this library loads; the ops' own
// registrars (in libopforge.so) have run by then.
std::vector<const OpDef*>& defined_ops() {
  static std::vector<const OpDef*> ops;
  return ops;
}

// What went wrong while registering; Python raises it as an ImportError. Nothing may throw out
// of a static initializer: that would abort the process.
std::string& registration_errors() {
  static std::string errors;
  return errors;
}

template <int I>
void boxed(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  try {
    run_boxed(*defined_ops()[I], stack, num_args, num_outputs);
  } catch (const Error& e) {
    remember_error(e);
    throw;
  }
}

template <int... I>
constexpr std::array<BoxedFn, sizeof...(I)> make_trampolines(std::integer_sequence<int, I...>) {
  return {&boxed<I>...};
}
constexpr auto kTrampolines = make_trampolines(std::make_integer_sequence<int, kMaxOps>{});

void note_error(const std::string& what) { registration_errors() += what + "\n"; }

void define_all(torch::stable::detail::StableLibrary& m) {
  for (const OpDef* op : all_ops()) {
    if (defined_ops().size() == kMaxOps) {
      note_error(str("opforge.torch supports at most ", kMaxOps, " ops (raise kMaxOps in bindings/torch/library.cc); '",
                     op->name(), "' and later ones are not registered"));
      return;
    }
    try {
      m.def(op->schema().text.c_str());
      defined_ops().push_back(op);
    } catch (const std::exception& e) {
      note_error(str("torch rejected the schema of '", op->name(), "' (", op->schema().text, "): ", e.what()));
    }
  }
}

void implement_all(torch::stable::detail::StableLibrary& m, const char* key) {
  for (size_t i = 0; i < defined_ops().size(); ++i) {
    try {
      m.impl(defined_ops()[i]->name().c_str(), kTrampolines[i]);
    } catch (const std::exception& e) {
      note_error(str("registering the ", key, " kernel of '", defined_ops()[i]->name(), "' failed: ", e.what()));
    }
  }
}

}  // namespace

}  // namespace opforge::torch_adapter

// Run in this order while the library loads (one translation unit initializes top to bottom).
STABLE_TORCH_LIBRARY(opforge, m) { opforge::torch_adapter::define_all(m); }
// CPU and CUDA tensors both reach the same kernel; opforge's dispatcher picks the backend by
// the tensors' device. Registering CUDA is harmless on a CPU-only torch.
STABLE_TORCH_LIBRARY_IMPL(opforge, CPU, m) { opforge::torch_adapter::implement_all(m, "CPU"); }
STABLE_TORCH_LIBRARY_IMPL(opforge, CUDA, m) { opforge::torch_adapter::implement_all(m, "CUDA"); }

// Empty when every op registered; otherwise one line per problem.
OPFORGE_TORCH_EXPORT const char* opforge_torch_registration_errors() {
  return opforge::torch_adapter::registration_errors().c_str();
}

// The opforge::ErrorKind (0 type, 1 value, 2 not implemented, 3 runtime) of a recent error whose
// message `text` contains, or -1. torch raises every kernel error as RuntimeError; opforge.torch
// uses this to raise TypeError, ValueError or NotImplementedError instead.
OPFORGE_TORCH_EXPORT int opforge_torch_error_kind(const char* text) {
  return opforge::torch_adapter::error_kind(text);
}
