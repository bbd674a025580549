// Ops and kernels register themselves from their own files at load time, so adding an op
// edits no central file. Use the macros; the functions are what they expand to.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "opforge/kernel.h"
#include "opforge/op.h"

namespace opforge {

struct KernelEntry {
  std::string backend;
  std::vector<DType> dtypes;  // of the op's dispatch argument
  KernelFn fn;
};

// Runs `declare` and stores the op. Never throws: it runs from static initializers, where an
// exception would abort the process. Failures (a bad schema, a name declared twice) are kept
// for registration_errors(), which the bindings raise at import.
bool register_op(const char* name, OpDef (*declare)());
std::vector<std::string> registration_errors();
bool register_kernel(std::string_view op, std::string_view backend, std::vector<DType> dtypes,
                     KernelFn fn);
// Freezes the kernel lists of the ops registered so far: a library loaded later (a plugin) may
// not add kernels to them, since calls read those lists without a lock. Called before each
// plugin loads; a plugin that tries is reported by registration_errors().
void seal_ops();

// Error(value) naming the known ops when `name` is not one of them.
const OpDef& find_op(std::string_view name);
const OpDef* lookup_op(std::string_view name);
std::vector<const OpDef*> all_ops();  // sorted by name
// Stable references: the tables only grow while libraries load, and a sealed op's list not at all.
const std::vector<KernelEntry>& kernels_of(std::string_view op);

}  // namespace opforge

#define OPFORGE_CONCAT_INNER(a, b) a##b
#define OPFORGE_CONCAT(a, b) OPFORGE_CONCAT_INNER(a, b)

// Declares op `name`; the body returns its OpDef.
#define OPFORGE_OP(name)                                                                  \
  static ::opforge::OpDef opforge_declare_##name();                                      \
  [[maybe_unused]] static const bool opforge_op_registered_##name =                       \
      ::opforge::register_op(#name, &opforge_declare_##name);                             \
  static ::opforge::OpDef opforge_declare_##name()

// Registers `fn` as op `op`'s kernel on `backend` ("cpu", "cuda") for the listed dtypes.
#define OPFORGE_KERNEL(op, backend, dtypes, fn)                                           \
  [[maybe_unused]] static const bool OPFORGE_CONCAT(opforge_kernel_registered_, __LINE__) = \
      ::opforge::register_kernel(#op, backend, dtypes, fn)
