// opforge._core: the generic Python adapter. Every op is reachable as an Op object whose
// call goes through the one validator and dispatcher; nothing here knows any op by name.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>

#include "call.h"
#include "function.h"
#include "opforge/dispatch.h"
#include "opforge/out.h"
#ifdef OPFORGE_WITH_CUDA
#include "opforge/cuda/blaslt.h"
#endif
#include "opforge/parallel.h"
#include "opforge/registry.h"
#include "opforge/simd.h"

namespace nb = nanobind;
using namespace opforge;

namespace {

struct PyOp {
  const OpDef* op;
};

nb::object default_of(const ArgSpec& arg) {
  if (!arg.default_value) return nb::none();
  return std::visit([](const auto& v) -> nb::object { return nb::cast(v); }, *arg.default_value);
}

nb::list op_args(const OpDef& op) {
  nb::list out;
  for (const auto& a : op.schema().args) {
    nb::dict d;
    d["name"] = a.name;
    d["kind"] = std::string(arg_kind_name(a.kind));
    d["has_default"] = a.has_default();
    d["default"] = default_of(a);
    if (a.is_tensor()) {
      std::vector<std::string> names;
      for (DType t : op.constraint(op.tensor_slot(a.name)).dtypes) names.emplace_back(dtype_name(t));
      d["dtypes"] = names;
      d["same_dtype_as"] = op.constraint(op.tensor_slot(a.name)).same_dtype_as;
    }
    out.append(d);
  }
  return out;
}

nb::list op_kernels(const OpDef& op) {
  nb::list out;
  for (const auto& k : kernels_of(op.name())) {
    nb::dict d;
    d["backend"] = k.backend;
    std::vector<std::string> names;
    for (DType t : k.dtypes) names.emplace_back(dtype_name(t));
    d["dtypes"] = names;
    out.append(d);
  }
  return out;
}

nb::list backend_list() {
  nb::list out;
  for (Backend* b : all_backends()) {
    nb::dict d;
    d["name"] = b->name();
    d["device"] = device_type_name(b->device_type());
    d["available"] = b->available();
    d["reason"] = b->available() ? std::string() : b->unavailable_reason();
    d["score"] = b->score();
    d["device_count"] = b->device_count();
    out.append(d);
  }
  return out;
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    PyObject* type = PyExc_RuntimeError;
    switch (e.kind()) {
      case ErrorKind::type: type = PyExc_TypeError; break;
      case ErrorKind::value: type = PyExc_ValueError; break;
      case ErrorKind::not_implemented: type = PyExc_NotImplementedError; break;
      case ErrorKind::runtime: type = PyExc_RuntimeError; break;
    }
    PyErr_SetString(type, e.what());
  }
}

}  // namespace

#ifdef OPFORGE_WITH_JAX
void register_jax_bindings(nb::module_& m);  // bindings/jax/module.cc
#endif

NB_MODULE(_core, m) {
  m.doc() = "opforge's C++ core: registry, validator, dispatcher, thread pool, SIMD targets.";
  nb::register_exception_translator(translate);
  // Op handles live in module-level functions and adapter caches until the interpreter is torn
  // down; nanobind would report those as leaks at exit.
  nb::set_leak_warnings(false);
  m.attr("__version__") = OPFORGE_VERSION;
#ifdef OPFORGE_WITH_CUDA
  m.attr("built_with_cuda") = true;
  // "80,90": the CMAKE_CUDA_ARCHITECTURES of this build, the nvcc it used and the CUDA
  // libraries' folder (what opforge.build_plugin compiles and links a plugin's .cu files with).
  m.attr("cuda_architectures") = OPFORGE_CUDA_ARCHITECTURES;
  m.attr("cuda_compiler") = OPFORGE_CUDA_COMPILER;
  m.attr("cuda_library_dir") = OPFORGE_CUDA_LIBRARY_DIR;
#else
  m.attr("built_with_cuda") = false;
  m.attr("cuda_architectures") = "";
  m.attr("cuda_compiler") = "";
  m.attr("cuda_library_dir") = "";
#endif

  nb::class_<PyOp>(m, "Op")
      .def("__call__", [](const PyOp& self, nb::args args, nb::kwargs kwargs) {
        python::CallArgsStorage storage;
        return python::call_op(*self.op, python::bind(*self.op, python::call_args(args, kwargs, storage)));
      })
      .def("fail_unsupported_dtype",
           [](const PyOp& self, const std::string& arg, const std::string& got) {
             fail_unsupported_dtype(*self.op, arg, got);
           },
           nb::arg("arg"), nb::arg("got"),
           "Raises the TypeError every frontend raises for an argument of a dtype opforge lacks.")
      .def("fail_out_needs_grad",
           [](const PyOp& self, const std::string& name) { fail_out_needs_grad(*self.op, name); }, nb::arg("name"),
           "Raises the TypeError for an input or out that requires grad: out= has no autograd.")
      .def("check_out_count",
           [](const PyOp& self, bool sequence, size_t given, const std::string& type) {
             check_out_count(*self.op, sequence, given, type);
           },
           nb::arg("sequence"), nb::arg("given"), nb::arg("type"),
           "Raises the TypeError for out= holding the wrong number of arrays (`type`: what was given).")
      .def("backend_for",
           [](const PyOp& self, nb::args args, nb::kwargs kwargs) {
             python::CallArgsStorage storage;
             const python::BoundArgs bound = python::bind(*self.op, python::call_args(args, kwargs, storage));
             return python::prepare_call(*self.op, bound).selection.backend->name();
           },
           "The backend a call with these arguments would run on (validates, runs nothing).")
      .def("infer",
           [](const PyOp& self, nb::sequence tensors, nb::dict attrs, nb::handle out) {
             return python::infer_call(*self.op, tensors, attrs, out);
           },
           nb::arg("tensors"), nb::arg("attrs"), nb::arg("out").none() = nb::none(),
           "Result (shape, dtype, strides) triples from per-tensor (shape, dtype[, (device type, index)[, strides]]) "
           "or None, and attributes: the strides a call would allocate its results with. `out`: the same metadata "
           "of out= tensors, one per result (or None), checked as a call with out= checks them (but for shared memory).")
      .def("attr",
           [](const PyOp& self, const std::string& name, nb::handle value) {
             const auto& args = self.op->schema().args;
             const int64_t i = self.op->schema().arg_index(name);
             if (i < 0 || args[i].is_tensor())
               fail(ErrorKind::value, self.op->name(), "() has no attribute argument '", name, "'");
             return python::attr_from_python(*self.op, args[i], value);
           },
           nb::arg("name"), nb::arg("value").none(),
           "Attribute `name` as the plain value the op takes (float, int, bool or str), checked as a call checks it.")
      .def_prop_ro("name", [](const PyOp& self) { return self.op->name(); })
      .def_prop_ro("schema", [](const PyOp& self) { return self.op->schema().text; })
      .def_prop_ro("doc", [](const PyOp& self) { return self.op->doc(); })
      .def_prop_ro("num_results", [](const PyOp& self) { return self.op->schema().num_results; })
      .def_prop_ro("args", [](const PyOp& self) { return op_args(*self.op); })
      .def_prop_ro("backward",
                   [](const PyOp& self) -> nb::object {
                     if (self.op->backward_op().empty()) return nb::none();
                     return nb::make_tuple(self.op->backward_op(), self.op->differentiable());
                   },
                   "(backward op name, [inputs it returns gradients for]) or None.")
      .def_prop_ro("saving_forward",
                   [](const PyOp& self) -> nb::object {
                     if (self.op->saving_op().empty()) return nb::none();
                     return nb::make_tuple(self.op->saving_op(), self.op->saved());
                   },
                   "(op run instead when a gradient is needed, [names of its extra results]) or None.")
      .def_prop_ro("identity_gradient", [](const PyOp& self) { return self.op->identity_inputs(); },
                   "Inputs whose gradient is the cotangent itself where they have the result's shape and dtype.")
      .def_prop_ro("shape_only", [](const PyOp& self) { return self.op->shape_only_args(); },
                   "Tensor arguments of which the op reads only the shape and dtype (see OpDef).")
      .def_prop_ro("autocast",
                   [](const PyOp& self) { return std::string(autocast_policy_name(self.op->autocast_policy())); },
                   "How torch.autocast casts the op's floating tensor arguments: none, lower_precision, fp32, promote.")
      .def_prop_ro("leading_dim_args", [](const PyOp& self) { return self.op->leading_dim_args(); },
                   "Tensor arguments whose leading dimensions the op maps over (see OpDef).")
      .def_prop_ro("elementwise", [](const PyOp& self) { return self.op->elementwise_args(); },
                   "Tensor arguments an elementwise op's results take their layout from (see OpDef), or [].")
      .def_prop_ro("validates", [](const PyOp& self) { return self.op->validated_args(); },
                   "Tensor arguments whose values the kernels check, so they run even for empty results (see OpDef).")
      .def_prop_ro("kernels", [](const PyOp& self) { return op_kernels(*self.op); })
      .def("__repr__", [](const PyOp& self) { return "<opforge op " + self.op->schema().text + ">"; });

  m.def("registration_errors", &registration_errors,
        "Ops whose declaration failed at load time (bad schema, duplicate name).");
  m.def("seal_ops", &seal_ops, "Freezes the kernel lists of the ops registered so far (before a plugin loads).");
  python::register_function_type(m);
  m.def("function", [](const PyOp& op, bool jax_only) { return python::make_function(*op.op, jax_only); },
        nb::arg("op"), nb::arg("jax_only") = false,
        "A Function calling `op` (what opforge.<op> is); `jax_only`: what opforge.jax.<op> is (calls on "
        "concrete JAX arrays run here, all others go to its _jax_route).");
  m.def("op", [](const std::string& name) { return PyOp{&find_op(name)}; }, nb::arg("name"),
        "The registered op `name`.");
  m.def("op_names", [] {
    std::vector<std::string> names;
    for (const OpDef* op : all_ops()) names.push_back(op->name());
    return names;
  });
  m.def("out_name", &out_name, nb::arg("i"), nb::arg("n"), "How errors name out i of n results: 'out', or 'out[i]'.");
  m.def("backends", &backend_list, "Backends with availability, reason and score.");
  m.def("num_threads", &num_threads);
  m.def("set_num_threads", &set_num_threads, nb::arg("n"));
  m.def("simd_targets_compiled", &simd_targets_compiled);
  m.def("simd_targets", &simd_targets_supported, "Compiled SIMD targets this CPU runs, best first.");
  m.def("simd_target", &simd_target_chosen, "The SIMD target kernels dispatch to now.");
  m.def("set_simd_target", &set_simd_target, nb::arg("name"),
        "Pin one SIMD target (tests); '' restores the automatic choice.");
  m.def("amx_supported", &amx_supported,
        "Whether this CPU and OS give this process Intel AMX (tiles and bfloat16 products).");
  m.def("amx_enabled", &amx_enabled, "Whether kernels use AMX now (supported and not turned off).");
  m.def("set_amx_enabled", &set_amx_enabled, nb::arg("enabled"),
        "Turn AMX on or off for this process (OPFORGE_AMX=0 starts it off); off, the AVX-512 kernels run "
        "as on CPUs without AMX.");
  m.def("bf16_convert_supported", &bf16_convert_supported,
        "Whether this CPU converts float to bfloat16 in one instruction (AVX512_BF16).");
  m.def("bf16_convert_enabled", &bf16_convert_enabled,
        "Whether the AVX-512 kernels store bfloat16 results with that instruction now.");
  m.def("set_bf16_convert_enabled", &set_bf16_convert_enabled, nb::arg("enabled"),
        "Turn the AVX512_BF16 conversion on or off for this process (OPFORGE_BF16_CONVERT=0 starts it off); "
        "the bits are the same either way, off rounds in software.");
  m.def("bf16_dot_supported", &bf16_dot_supported,
        "Whether this CPU multiplies bfloat16 pairs in one instruction (AVX512_BF16's vdpbf16ps).");
  m.def("bf16_dot_enabled", &bf16_dot_enabled, "Whether linear_act's bfloat16 products use those dot products now.");
  m.def("set_bf16_dot_enabled", &set_bf16_dot_enabled, nb::arg("enabled"),
        "Turn the AVX512_BF16 dot products on or off for this process (OPFORGE_BF16_DOT=0 starts them off); "
        "off, linear_act's bfloat16 products run on float32 FMAs (other bits: see opforge/simd.h).");
  m.def("bf16_grad_rounding_enabled", &bf16_grad_rounding_enabled,
        "Whether linear_act_backward (CPU) rounds g = grad * act'(z) to bfloat16 before its products.");
  m.def("set_bf16_grad_rounding_enabled", &set_bf16_grad_rounding_enabled, nb::arg("enabled"),
        "Round linear_act_backward's bfloat16 g to bfloat16, as torch and JAX do, so its products run on "
        "bfloat16 units (OPFORGE_BF16_GRAD_ROUNDING=1 starts it on; off by default: g stays float32).");
  m.def("set_backend", &set_backend_override, nb::arg("op"), nb::arg("backend"));
  m.def("backend_override", &backend_override, nb::arg("op"));
  m.def("reload_config", &reload_config);
#ifdef OPFORGE_WITH_CUDA
  m.def("cublaslt_status", &cuda::blaslt::status, "Whether linear_act on CUDA uses cuBLASLt, and why not.");
  m.def("set_cublaslt", &cuda::blaslt::set_enabled, nb::arg("enabled"),
        "Turn cuBLASLt on or off for this process (tests, benchmarks); returns the previous setting.");
  m.def("cublaslt_calls", [] {
    const cuda::blaslt::Calls c = cuda::blaslt::calls();
    return std::make_tuple(c.taken, c.declined);
  }, "(products run through cuBLASLt, products it declined) since the process started.");
#else
  m.def("cublaslt_status", [] { return std::string("not built in (a CPU-only build)"); });
  m.def("set_cublaslt", [](bool) { return false; }, nb::arg("enabled"));
  m.def("cublaslt_calls", [] { return std::make_tuple(int64_t{0}, int64_t{0}); });
#endif
#ifdef OPFORGE_WITH_JAX
  register_jax_bindings(m);
#endif
}
