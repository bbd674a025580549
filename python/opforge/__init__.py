"""opforge: operators written once in C++, run from NumPy, PyTorch, JAX and any DLPack array.

Every registered op is a function here: ``opforge.rms_norm(x, weight, eps=1e-6)`` takes arrays
of any DLPack-capable library (without a copy) and returns the same kind of array.
Where torch is installed, every op is also a real torch operator, torch.ops.opforge.<op>, with
autograd and torch.compile (see opforge.torch): it is defined as soon as both opforge and torch
are imported, in either order, without `import opforge` importing torch itself. Given only torch
tensors, opforge.<op> calls opforge.torch.<op> (autograd, torch.compile); given a JAX tracer
(under jit, grad, vmap) or only JAX arrays, opforge.jax.<op>.
"""

from __future__ import annotations

import importlib as _importlib
import importlib.abc as _importlib_abc
import importlib.util as _importlib_util
import inspect as _inspect
import sys as _sys
import warnings as _warnings
from pathlib import Path as _Path

del annotations  # the __future__ feature's name: not part of opforge's namespace

from . import _core
from ._core import (
    amx_enabled,
    amx_supported,
    backends,
    bf16_convert_enabled,
    bf16_convert_supported,
    bf16_dot_enabled,
    bf16_dot_supported,
    bf16_grad_rounding_enabled,
    num_threads,
    reload_config,
    set_amx_enabled,
    set_bf16_convert_enabled,
    set_bf16_dot_enabled,
    set_bf16_grad_rounding_enabled,
    set_num_threads,
    set_simd_target,
    simd_target,
    simd_targets,
    simd_targets_compiled,
)

__version__ = _core.__version__

from . import plugins  # noqa: E402
from .plugins import PluginError, build_plugin  # noqa: E402

# Paths of the libraries of ops compiled apart from this build (opforge.build_plugin), loaded
# before the functions below are made so that they are opforge ops like the rest; their
# registration errors surface here too. (opforge.plugins stays the module.)
loaded_plugins = plugins.load_from_environment()

if _core.registration_errors():
    raise ImportError("opforge: some ops failed to register:\n  " + "\n  ".join(_core.registration_errors()))

# Annotations as text, as a type stub writes them (python -m opforge._stub prints these signatures).
_KIND_ANNOTATION = {"Tensor": "Array", "Tensor?": "Array | None", "float": "float", "int": "int",
                    "bool": "bool", "str": "str"}


def _signature(op: _core.Op, out: bool = False) -> _inspect.Signature:
    """The schema as a Python signature; with `out`, the generic functions' keyword-only out=
    (arrays to write the results into: one, or a sequence with an array or None per result)."""
    params = []
    for a in op.args:
        default = a["default"] if a["has_default"] else _inspect.Parameter.empty
        params.append(_inspect.Parameter(a["name"], _inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                         default=default, annotation=_KIND_ANNOTATION[a["kind"]]))
    n = op.num_results
    returns = "Array" if n == 1 else f"tuple[{', '.join(['Array'] * n)}]"
    if out and "out" not in (a["name"] for a in op.args):
        params.append(_inspect.Parameter("out", _inspect.Parameter.KEYWORD_ONLY, default=None,
                                         annotation="Array | None" if n == 1 else "Sequence[Array | None] | None"))
    return _inspect.Signature(params, return_annotation=returns)


_OUT_DOC = """

out=: the arrays to write the results into instead of new ones (NumPy, torch, CuPy or any DLPack
array; one, or a tuple with an array or None per result), returned as given. Each must have the
result's dtype, shape and device, be writable, row-major (any dense order for elementwise ops)
and share no memory with an input, but an elementwise op may write over an input (relu(x, out=x)).
Torch tensors go to the op's out variant, torch.ops.opforge.<op>.out (meta and forge tensors and
torch.compile too). Not under autograd or JAX tracing (JAX arrays are immutable)."""


def _make_function(op: _core.Op):
    # A C++ callable (vectorcall: no Python frame, no argument tuple) that binds, validates and
    # runs; the package gives it the name, signature and docstring that help() and IDEs show.
    function = _core.function(op)
    function.__name__ = function.__qualname__ = op.name
    function.__module__ = __name__
    function.__signature__ = _signature(op, out=True)
    function.__doc__ = f"{op.schema}\n\n{op.doc}\n\nKernels: " + ", ".join(
        f"{k['backend']} {k['dtypes']}" for k in op.kernels) + _OUT_DOC
    function.op = op
    return function


def ops() -> list[dict]:
    """Every registered op: name, schema, doc, per-argument dtypes, kernels per backend, its
    backward op and differentiable inputs (or None), its saving forward (or None), the inputs
    whose gradient is the cotangent itself where they do not broadcast (identity_gradient) and
    the tensor arguments it reads only the shape of (shape_only), how torch.autocast casts
    its floating inputs (autocast: none, lower_precision, fp32, promote) and, for elementwise
    ops, the arguments whose layout (a transpose, channels-last) the results keep (elementwise)."""
    out = []
    for name in _core.op_names():
        op = _core.op(name)
        out.append({"name": name, "schema": op.schema, "doc": op.doc, "args": op.args,
                    "kernels": op.kernels, "backward": op.backward, "saving_forward": op.saving_forward,
                    "identity_gradient": op.identity_gradient, "shape_only": op.shape_only,
                    "autocast": op.autocast, "elementwise": op.elementwise})
    return out


def set_backend(backend: str | None, op: str | None = None) -> None:
    """Force `backend` ("cpu", "cuda") for `op`, or for every op when op is None.
    backend=None removes the override. Asking for an unknown backend or op raises ValueError;
    a forced backend that cannot run the inputs raises at call time (never a silent fallback)."""
    _core.set_backend(op or "", backend or "")


def info() -> dict:
    """Version, SIMD targets (compiled, supported, chosen), whether AMX and the AVX512_BF16
    conversion and dot products are supported and used, whether linear_act_backward rounds its
    bfloat16 g, backends, whether linear_act on CUDA uses cuBLASLt, and the thread count."""
    return {
        "version": __version__,
        "simd_compiled": simd_targets_compiled(),
        "simd_supported": simd_targets(),
        "simd_chosen": simd_target(),
        "amx": {"supported": amx_supported(), "enabled": amx_enabled()},
        "bf16_convert": {"supported": bf16_convert_supported(), "enabled": bf16_convert_enabled()},
        "bf16_dot": {"supported": bf16_dot_supported(), "enabled": bf16_dot_enabled()},
        "bf16_grad_rounding": bf16_grad_rounding_enabled(),
        "backends": backends(),
        "built_with_cuda": _core.built_with_cuda,
        "cublaslt": _core.cublaslt_status(),
        "num_threads": num_threads(),
        "plugins": list(loaded_plugins),
        "ops": _core.op_names(),
    }


# opforge's submodules, imported or not: no op may take their names (nor any attribute's).
_SUBMODULES = {"cli", "forge", "ggml_cpu", "jax", "plugins", "references", "scaffold", "testing", "torch", "tour"}


def _add_functions(names: list[str], error: type[Exception] = ImportError) -> None:
    for name in names:
        # Only a plugin's op can get here with such a name (new-op and the built-in ops avoid them).
        if name in globals() or name in _SUBMODULES:
            raise error(f"opforge: op '{name}' would replace opforge.{name}; rename the op "
                        f"(plugins: {', '.join(loaded_plugins) or 'none'})")
    for name in names:
        globals()[name] = _make_function(_core.op(name))


_add_functions(_core.op_names())


def load_plugin(library: str | _Path) -> list[str]:
    """Loads a plugin library (from build_plugin) into this running process and returns the
    names of the ops it added. They are then opforge ops like the rest, in the frontends already
    imported and in those imported later: opforge.<op>, torch.ops.opforge.<op> (autograd,
    torch.compile, forge) with opforge.torch.<op>, opforge.jax.<op>.

    Loading a library again adds nothing. An op already loaded cannot be replaced: a changed
    op needs a new process (or a new name). PluginError when the library cannot be loaded or
    its ops are rejected; what did register before the error stays registered."""
    path = str(_Path(library).resolve())
    if any(str(_Path(p).resolve()) == path for p in loaded_plugins):
        return []
    names_before, errors_before = set(_core.op_names()), set(_core.registration_errors())
    plugins.load(path, PluginError, "load_plugin()")
    loaded_plugins.append(path)
    errors = [e for e in _core.registration_errors() if e not in errors_before]
    if errors:
        raise PluginError(f"load_plugin(): {path}: some ops failed to register:\n  " + "\n  ".join(errors))
    added = [name for name in _core.op_names() if name not in names_before]
    _add_functions(added, PluginError)
    for module in ("opforge.torch", "opforge.forge", "opforge.jax"):  # torch defines the ops forge implements
        if module in _sys.modules:
            try:
                _sys.modules[module]._add_ops(added)
            except (ImportError, RuntimeError) as error:  # what each frontend raises at import
                raise PluginError(f"load_plugin(): {path}: {error}") from None
    return added


def _load_adapter(module: str, what: str) -> None:
    """Imports opforge.torch or opforge.jax. A failure (say, a framework older than the adapter
    supports, or one whose API moved) is a warning here, not a failed `import opforge`,
    `import torch` or `import jax`; importing the adapter itself then raises the error."""
    if module in _sys.modules:
        return
    try:
        _importlib.import_module(module)
    except Exception as error:  # any: see the docstring
        _warnings.warn(f"opforge: {what} unavailable: {error}", stacklevel=3)


class _AfterImport(_importlib_abc.MetaPathFinder):
    """Runs `then` right after the module `name` finishes importing. Importing torch takes
    seconds, so `import opforge` imports neither torch nor JAX; yet torch.ops.opforge.<op>
    exists, and opforge.<op> takes torch tensors and JAX tracers through those frameworks'
    adapters, whichever of them and opforge is imported first. The finder stays in place until
    the module is executed, not merely looked up (libraries probe with find_spec), and a
    failure in `then` is a warning: it must never fail the framework's own import."""

    def __init__(self, name: str, then):
        self.name, self.then, self.looking = name, then, False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self.looking:
            return None
        self.looking = True
        try:
            spec = _importlib_util.find_spec(fullname)  # the regular finders: this one steps aside
        finally:
            self.looking = False
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module

            def exec_then_load(module):
                exec_module(module)
                if self in _sys.meta_path:
                    _sys.meta_path.remove(self)
                try:
                    self.then()
                except Exception as error:  # any: see the docstring
                    _warnings.warn(f"opforge: after importing {fullname}: {error}", stacklevel=2)

            spec.loader.exec_module = exec_then_load
        return spec


def _when_imported(name: str, then) -> None:
    if name in _sys.modules:
        then()
    else:
        _sys.meta_path.insert(0, _AfterImport(name, then))


# Only where this build has the adapter (cmake/torch.cmake builds it when torch is installed,
# the JAX handlers when jaxlib is).
if (_Path(__file__).with_name("libopforge_torch.so")).exists():
    _when_imported("torch", lambda: _load_adapter("opforge.torch", "torch.ops.opforge is"))
if hasattr(_core, "jax_ffi"):
    _when_imported("jax", lambda: _load_adapter("opforge.jax", "opforge.jax (and opforge.<op> under jax.jit) is"))
