// Kernel selection: a forced backend from the config if there is one, else the best
// available backend with a kernel for the inputs' device and dtype.
#include "opforge/dispatch.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <atomic>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "json.h"
#include "opforge/parallel.h"
#include "opforge/registry.h"

namespace opforge {

namespace {

struct Override {
  std::string backend;
  std::string source;  // "OPFORGE_BACKEND", "config file x.json", "set_backend()"
};

struct Overrides {
  std::mutex mutex;
  bool loaded = false;
  std::map<std::string, Override> by_op;  // "" = every op
  // by_op is non-empty (or not loaded yet): lets the common no-override case skip the lock.
  std::atomic<bool> maybe_any{true};
};

Overrides& overrides() {
  static Overrides o;
  return o;
}

std::string known_backends() {
  std::string out;
  for (Backend* b : all_backends()) out += (out.empty() ? "" : ", ") + b->name();
  return out;
}

void check_names(const std::string& op, const std::string& backend, const std::string& source) {
  if (!op.empty() && !lookup_op(op))
    fail(ErrorKind::value, source, " names unknown op '", op, "'");
  if (!backend.empty() && !lookup_backend(backend))
    fail(ErrorKind::value, source, " names unknown backend '", backend, "' (known: ", known_backends(), ")");
}

// One override read from the environment or the config file. An empty backend name would
// reach select_kernel as a null backend, so it is an error here.
void add_override(std::map<std::string, Override>& out, const std::string& op, const std::string& backend,
                  const std::string& source) {
  if (backend.empty())
    fail(ErrorKind::value, source, " names no backend", op.empty() ? "" : " for op '" + op + "'",
         " (known: ", known_backends(), ")");
  check_names(op, backend, source);
  out[op] = {backend, source};
}

// OPFORGE_BACKEND: "cpu" (every op), "rms_norm=cpu,add=cuda", or both mixed.
void read_environment(std::map<std::string, Override>& out) {
  const char* env = std::getenv("OPFORGE_BACKEND");
  if (!env || !*env) return;
  std::stringstream items(env);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    std::string op = eq == std::string::npos ? "" : item.substr(0, eq);
    std::string backend = eq == std::string::npos ? item : item.substr(eq + 1);
    add_override(out, op, backend, "OPFORGE_BACKEND");
  }
}

// OPFORGE_CONFIG names a JSON file:
//   {"backend": "cpu", "ops": {"rms_norm": "cpu"}, "num_threads": 2}
void read_config_file(std::map<std::string, Override>& out) {
  const char* path = std::getenv("OPFORGE_CONFIG");
  if (!path || !*path) return;
  const std::string source = str("config file ", path);
  std::ifstream file(path);
  if (!file) fail(ErrorKind::value, "OPFORGE_CONFIG: cannot read ", path);
  std::stringstream text;
  text << file.rdbuf();
  json::Value doc;
  try {
    doc = json::parse(text.str());
  } catch (const std::invalid_argument& e) {
    fail(ErrorKind::value, source, ": invalid JSON: ", e.what());
  }
  if (!doc.is_object()) fail(ErrorKind::value, source, ": expected a JSON object, got ", doc.type_name());
  for (const auto& [key, value] : doc.object()) {
    if (key == "backend") {
      if (!value.is_string()) fail(ErrorKind::value, source, ": 'backend' must be a string, got ", value.type_name());
      add_override(out, "", value.string(), source);
    } else if (key == "ops") {
      if (!value.is_object()) fail(ErrorKind::value, source, ": 'ops' must be an object, got ", value.type_name());
      for (const auto& [op, backend] : value.object()) {
        if (!backend.is_string())
          fail(ErrorKind::value, source, ": 'ops.", op, "' must be a backend name, got ", backend.type_name());
        add_override(out, op, backend.string(), source);
      }
    } else if (key == "num_threads") {
      // Checked before the cast: 2.5 would truncate silently and 1e999 (inf) is undefined.
      const bool whole = value.is_number() && value.number() >= 1 && value.number() <= 65536 &&
                         value.number() == std::floor(value.number());
      if (!whole)
        fail(ErrorKind::value, source, ": 'num_threads' must be a whole number in [1, 65536], got ",
             value.is_number() ? str(value.number()) : std::string(value.type_name()));
      set_num_threads(static_cast<int64_t>(value.number()));
    } else {
      fail(ErrorKind::value, source, ": unknown key '", key, "' (expected backend, ops, num_threads)");
    }
  }
}

// Caller holds the mutex. The environment wins over the file: it is the narrower setting.
void load_locked(Overrides& o) {
  std::map<std::string, Override> fresh;
  read_config_file(fresh);
  read_environment(fresh);
  o.by_op = std::move(fresh);
  o.loaded = true;
  o.maybe_any.store(!o.by_op.empty(), std::memory_order_release);
}

std::optional<Override> override_for(const std::string& op) {
  Overrides& o = overrides();
  if (!o.maybe_any.load(std::memory_order_acquire)) return std::nullopt;
  std::lock_guard lock(o.mutex);
  if (!o.loaded) load_locked(o);
  auto it = o.by_op.find(op);
  if (it == o.by_op.end()) it = o.by_op.find("");
  if (it == o.by_op.end()) return std::nullopt;
  return it->second;
}

bool has_dtype(const KernelEntry& k, DType dtype) {
  return std::find(k.dtypes.begin(), k.dtypes.end(), dtype) != k.dtypes.end();
}

}  // namespace

void reload_config() {
  Overrides& o = overrides();
  std::lock_guard lock(o.mutex);
  // Not loaded until this load succeeds: a bad setting is reported again at the next lookup, which
  // the fast path would skip if an earlier load had found no overrides.
  o.loaded = false;
  o.maybe_any.store(true, std::memory_order_release);
  load_locked(o);
}

void set_backend_override(const std::string& op, const std::string& backend) {
  check_names(op, backend, "set_backend()");
  Overrides& o = overrides();
  std::lock_guard lock(o.mutex);
  if (!o.loaded) load_locked(o);
  if (backend.empty()) o.by_op.erase(op);
  else o.by_op[op] = {backend, "set_backend()"};
  o.maybe_any.store(!o.by_op.empty(), std::memory_order_release);
}

std::string backend_override(const std::string& op) {
  auto o = override_for(op);
  return o ? o->backend : "";
}

Selection select_kernel(const OpDef& op, const OpInputs& inputs) {
  const Device device = device_of(inputs);
  const int64_t slot = op.dispatch_slot();
  const DType dtype = slot >= 0 && inputs.tensors[slot] ? inputs.tensors[slot]->dtype : DType::float32;
  const auto& kernels = kernels_of(op.name());
  // Only errors need the words; building them on every call cost more than the rest of the lookup.
  auto where = [&] { return str("for dtype ", dtype_name(dtype), " on ", device_name(device)); };

  if (auto forced = override_for(op.name())) {
    Backend* backend = lookup_backend(forced->backend);
    const std::string by = str("backend '", forced->backend, "' (forced by ", forced->source, ")");
    if (backend->device_type() != device.type)
      fail(ErrorKind::runtime, op.name(), "(): ", by, " cannot run on ", device_type_name(device.type),
           " tensors");
    if (!backend->available())
      fail(ErrorKind::runtime, op.name(), "(): ", by, " is not available: ", backend->unavailable_reason());
    for (const auto& k : kernels)
      if (k.backend == forced->backend && has_dtype(k, dtype)) return {backend, k.fn};
    fail(ErrorKind::not_implemented, op.name(), "(): ", by, " has no kernel ", where());
  }

  Selection best{nullptr, nullptr};
  std::string unavailable;
  for (const auto& k : kernels) {
    Backend* backend = lookup_backend(k.backend);
    if (!backend || backend->device_type() != device.type || !has_dtype(k, dtype)) continue;
    if (!backend->available()) {
      unavailable += str(unavailable.empty() ? "" : "; ", k.backend, ": ", backend->unavailable_reason());
      continue;
    }
    if (!best.backend || backend->score() > best.backend->score()) best = {backend, k.fn};
  }
  if (best.backend) return best;
  if (!unavailable.empty())
    fail(ErrorKind::runtime, op.name(), "(): no available backend ", where(), " (", unavailable, ")");
  std::string have;
  for (const auto& k : kernels) have += str(have.empty() ? "" : ", ", k.backend, " ", dtype_list(k.dtypes));
  fail(ErrorKind::not_implemented, op.name(), "(): no kernel ", where(),
       have.empty() ? std::string(" (the op has no kernels)") : " (kernels: " + have + ")");
}

}  // namespace opforge
