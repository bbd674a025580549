// The op, kernel and backend tables, filled by static registrars at load time: libopforge's
// own while it loads, a plugin's when opforge loads the plugin (at import, or later through
// opforge.load_plugin while other threads may be running ops: hence the lock).
#include "opforge/registry.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>

#include "opforge/backend.h"

namespace opforge {

namespace {
// Function-local statics: registrars in other translation units may run first.
std::map<std::string, OpDef, std::less<>>& op_table() {
  static std::map<std::string, OpDef, std::less<>> table;
  return table;
}
std::map<std::string, std::vector<KernelEntry>, std::less<>>& kernel_table() {
  static std::map<std::string, std::vector<KernelEntry>, std::less<>> table;
  return table;
}
std::vector<std::unique_ptr<Backend>>& backend_table() {
  static std::vector<std::unique_ptr<Backend>> table;
  return table;
}
// Ops whose kernel lists may no longer change (seal_ops): calls read those lists unlocked.
std::set<std::string, std::less<>>& sealed_ops() {
  static std::set<std::string, std::less<>> sealed;
  return sealed;
}
// Guards the op and kernel tables' structure: writers are registrars, readers every call.
std::shared_mutex& table_mutex() {
  static std::shared_mutex mutex;
  return mutex;
}
}  // namespace

static std::vector<std::string>& error_table() {
  static std::vector<std::string> errors;
  return errors;
}

bool register_op(const char* name, OpDef (*declare)()) {
  try {
    OpDef op = declare();
    if (op.name() != name)
      fail(ErrorKind::value, "OPFORGE_OP(", name, ") declares a schema named '", op.name(), "'");
    std::unique_lock lock(table_mutex());
    auto [it, inserted] = op_table().emplace(op.name(), std::move(op));
    if (!inserted)
      fail(ErrorKind::value, "op '", name, "' is declared twice: two op folders with one name, or a plugin ",
           "redeclaring an op already loaded (a loaded op cannot be replaced in a running process: start a new ",
           "one, or rename the op)");
    return true;
  } catch (const std::exception& e) {
    std::unique_lock lock(table_mutex());
    error_table().push_back(str("op '", name, "': ", e.what()));
    return false;
  }
}

static const OpDef* lookup_op_unlocked(std::string_view name);

// The saving forward of `op` (OpDef::saving_forward): registered, the same arguments, op's
// result and then one per saved name.
static void check_saving_unlocked(const OpDef& op, const OpDef* bwd, std::vector<std::string>& errors) {
  const OpDef* saving = lookup_op_unlocked(op.saving_op());
  const std::string who = str("op '", op.name(), "': saving forward '", op.saving_op(), "'");
  if (!saving) return errors.push_back(who + " is not registered");
  if (op.backward_op().empty()) errors.push_back(who + " is declared without a backward op to use what it saves");
  const auto& args = op.schema().args;
  const auto& saving_args = saving->schema().args;
  bool same = args.size() == saving_args.size();
  for (size_t i = 0; same && i < args.size(); ++i)
    same = args[i].name == saving_args[i].name && args[i].kind == saving_args[i].kind &&
           args[i].default_value == saving_args[i].default_value;
  if (!same) errors.push_back(str(who, " must take the same arguments as '", op.name(), "'"));
  if (op.schema().num_results != 1) errors.push_back(str(who, ": only an op with one result can have one"));
  const int64_t want = 1 + static_cast<int64_t>(op.saved().size());
  if (saving->schema().num_results != want)
    errors.push_back(str(who, " must return ", want, " results (the result of '", op.name(),
                         "', then one per saved name), not ", saving->schema().num_results));
  if (!bwd) return;
  for (const auto& name : op.saved()) {
    const int64_t i = bwd->schema().arg_index(name);
    if (i >= 0 && bwd->schema().args[i].kind != ArgKind::optional_tensor)
      errors.push_back(str("op '", op.name(), "': backward op '", bwd->name(), "' must take saved '", name,
                           "' as 'Tensor? ", name, "=None' (it is None where the forward cannot save)"));
  }
}

// Backward declarations can only be checked once every op has loaded.
static void check_backward_unlocked(const OpDef& op, std::vector<std::string>& errors) {
  const OpDef* bwd = op.backward_op().empty() ? nullptr : lookup_op_unlocked(op.backward_op());
  if (!op.saving_op().empty()) check_saving_unlocked(op, bwd, errors);
  if (op.backward_op().empty()) {
    if (!op.identity_inputs().empty())
      errors.push_back(str("op '", op.name(), "': an identity gradient is declared without a backward op ",
                           "(which computes the gradients where an input broadcasts)"));
    return;
  }
  if (!bwd) {
    errors.push_back(str("op '", op.name(), "': backward op '", op.backward_op(), "' is not registered"));
    return;
  }
  const auto& saved = op.saved();
  for (const auto& arg : bwd->schema().args)
    if (arg.name != "grad" && arg.name != "result" && arg.name != "output_mask" &&
        op.schema().arg_index(arg.name) < 0 && std::find(saved.begin(), saved.end(), arg.name) == saved.end())
      errors.push_back(str("op '", op.name(), "': backward op '", bwd->name(), "' takes '", arg.name,
                           "', which is neither 'grad', 'result', 'output_mask', an argument of '", op.name(),
                           "' nor a result its saving forward saves"));
  for (const auto& name : op.identity_inputs())
    if (std::find(op.differentiable().begin(), op.differentiable().end(), name) == op.differentiable().end())
      errors.push_back(str("op '", op.name(), "': identity gradient of '", name, "', which its backward op '",
                           bwd->name(), "' does not differentiate"));
  if (op.schema().num_results != 1 && !op.identity_inputs().empty())
    errors.push_back(str("op '", op.name(), "': an identity gradient needs an op with one result"));
  if (bwd->schema().num_results != static_cast<int64_t>(op.differentiable().size()))
    errors.push_back(str("op '", op.name(), "': backward op '", bwd->name(), "' returns ", bwd->schema().num_results,
                         " results for ", op.differentiable().size(), " differentiable inputs"));
}

std::vector<std::string> registration_errors() {
  std::shared_lock lock(table_mutex());
  std::vector<std::string> errors = error_table();
  for (const auto& [_, op] : op_table()) check_backward_unlocked(op, errors);
  for (const auto& [name, _] : kernel_table())
    if (!op_table().count(name))
      errors.push_back(str("a kernel is registered for op '", name, "', which no OPFORGE_OP declares"));
  return errors;
}

bool register_kernel(std::string_view op, std::string_view backend, std::vector<DType> dtypes,
                     KernelFn fn) {
  std::unique_lock lock(table_mutex());
  if (sealed_ops().count(op)) {
    // Running calls read this op's kernel list without the lock; it must not move under them.
    error_table().push_back(str("a ", backend, " kernel for op '", op, "' comes from a library loaded after the op: ",
                                "a plugin may add kernels only to the ops it declares"));
    return false;
  }
  kernel_table()[std::string(op)].push_back({std::string(backend), std::move(dtypes), fn});
  return true;
}

void seal_ops() {
  std::unique_lock lock(table_mutex());
  for (const auto& [name, _] : op_table()) sealed_ops().insert(name);
}

static const OpDef* lookup_op_unlocked(std::string_view name) {
  auto it = op_table().find(name);
  return it == op_table().end() ? nullptr : &it->second;
}

const OpDef* lookup_op(std::string_view name) {
  std::shared_lock lock(table_mutex());
  return lookup_op_unlocked(name);
}

const OpDef& find_op(std::string_view name) {
  std::shared_lock lock(table_mutex());
  if (const OpDef* op = lookup_op_unlocked(name)) return *op;
  std::string known;
  for (const auto& [n, _] : op_table()) known += (known.empty() ? "" : ", ") + n;
  lock.unlock();
  fail(ErrorKind::value, "unknown op '", name, "' (known ops: ", known, ")");
}

std::vector<const OpDef*> all_ops() {
  std::shared_lock lock(table_mutex());
  std::vector<const OpDef*> ops;
  for (const auto& [_, op] : op_table()) ops.push_back(&op);
  return ops;
}

const std::vector<KernelEntry>& kernels_of(std::string_view op) {
  static const std::vector<KernelEntry> none;
  std::shared_lock lock(table_mutex());
  auto it = kernel_table().find(op);
  return it == kernel_table().end() ? none : it->second;
}

void register_backend(std::unique_ptr<Backend> backend) {
  backend_table().push_back(std::move(backend));
}

std::vector<Backend*> all_backends() {
  std::vector<Backend*> out;
  for (auto& b : backend_table()) out.push_back(b.get());
  return out;
}

Backend* lookup_backend(const std::string& name) {
  for (auto& b : backend_table())
    if (b->name() == name) return b.get();
  return nullptr;
}

}  // namespace opforge
