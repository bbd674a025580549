"""opforge ops as JAX functions, derived from their declarations: no per-op JAX code.

``opforge.jax.rms_norm(x, weight, eps=1e-6)`` lowers to one XLA FFI custom call (the handler
in bindings/jax/) on the CPU or, when built with CUDA, on the GPU with XLA's stream. Result
shapes come from the op's C++ shape rule, so bad inputs fail at trace time with opforge's
messages. ``jax.grad`` works through ops that declare a backward op (a ``jax.custom_vjp``
calls it); ``jax.vmap`` works everywhere: ops that map over the leading dimensions of their
arguments take the batch as one more leading dimension (one call), others run a
``lax.map`` over the batch. Called on concrete arrays, an op runs as one jitted custom call,
and errors its kernel reports while running come back as the typed exceptions the other
frontends raise. opforge.<op> hands JAX tracers here, and runs calls on JAX arrays alone
through the same jitted calls (``_compiled``); so does opforge.jax.<op>, a C++ callable that
hands everything else to the Python function this module makes for it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

import opforge as _opforge  # the package, perhaps still importing: its functions exist

from . import _core, _signature

_TARGET = "opforge_call"
# jax.core.Tracer is the public name; the fallback is where it is defined, should a release
# stop exporting it.
_Tracer = getattr(jax.core, "Tracer", None) or importlib.import_module("jax._src.core").Tracer

# Attribute names the FFI call uses for itself; schemas must not use them.
_RESERVED = ("op", "present")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("+")[0].split(".")[:3] if p.isdigit())


def _check_abi() -> None:
    built = _core.jax_ffi.jaxlib_version
    major, minor = _core.jax_ffi.ffi_api_version
    if _version(jaxlib.__version__) < _version(built):
        raise ImportError(
            f"opforge.jax: opforge's XLA FFI handlers were built against jaxlib {built} "
            f"(XLA FFI API {major}.{minor}), but the running jaxlib is {jaxlib.__version__}; XLA "
            "rejects handlers built against newer FFI headers than its own. Rebuild opforge "
            "with this jaxlib installed (pip install --no-build-isolation .) or upgrade jaxlib.")


if not hasattr(_core, "jax_ffi"):
    raise ImportError("opforge.jax: this opforge was built without the JAX adapter (jaxlib was "
                      "not installed at build time); install jax and rebuild opforge")
_check_abi()
for _platform, _capsule in _core.jax_ffi.handlers().items():
    jax.ffi.register_ffi_target(_TARGET, _capsule, platform=_platform)


def _attr(kind: str, value):
    # FFI attributes must be typed NumPy scalars; the C++ side decodes these exact types.
    return {"float": np.float64, "int": np.int64, "bool": np.bool_, "str": str}[kind](value)


class _Op:
    """What the JAX side needs to know of one op, read once from its declaration."""

    def __init__(self, name: str):
        self.core = _core.op(name)
        self.name = name
        self.args = self.core.args
        self.tensor_names = [a["name"] for a in self.args if a["kind"].startswith("Tensor")]
        self.attr_kinds = {a["name"]: a["kind"] for a in self.args if not a["kind"].startswith("Tensor")}
        self.signature = _signature(self.core)
        self.names = list(self.signature.parameters)
        self.defaults = {n: p.default for n, p in self.signature.parameters.items()}  # empty: required
        self.leading = set(self.core.leading_dim_args)
        self.validates = set(self.core.validates)
        self.backward = self.core.backward
        self.multi = self.core.num_results > 1

    def _bind_plainly(self, args, kwargs):
        """Arguments by name, bound by hand (a third of inspect's cost, paid on every call on
        concrete arrays), or None where the call is not plainly well formed."""
        if len(args) > len(self.names):
            return None
        values = dict(zip(self.names, args))
        for name, value in kwargs.items():
            if name in values or name not in self.defaults:
                return None
            values[name] = value
        for name, default in self.defaults.items():
            if name not in values:
                if default is inspect.Parameter.empty:
                    return None
                values[name] = default
        return values

    def bind(self, args, kwargs):
        values = self._bind_plainly(args, kwargs)
        if values is None:  # something is wrong: the signature says what
            try:
                bound = self.signature.bind(*args, **kwargs)
            except TypeError as e:
                raise TypeError(f"{self.name}(): {e}") from None
            bound.apply_defaults()
            values = bound.arguments
        tensors = []
        for name in self.tensor_names:
            t = values[name]
            if t is not None and not (hasattr(t, "shape") and hasattr(t, "dtype")):
                raise TypeError(f"{self.name}(): '{name}' must be an array, got {type(t).__name__}")
            tensors.append(t)
        attrs = {name: _static_attr(self.core, name, kind, values[name]) for name, kind in self.attr_kinds.items()}
        return tensors, attrs


def _static_attr(op: _core.Op, name: str, kind: str, value):
    """An attribute as the plain Python value it stands for, checked by the C++ call path's own
    rules (NumPy and concrete JAX scalars pass, 2.0 is no int, ranges). Attributes are constants
    of the custom call, fixed when tracing, and the key of the traced-call cache."""
    if isinstance(value, _Tracer):
        raise TypeError(f"{op.name}(): '{name}' must be {'an' if kind == 'int' else 'a'} {kind} known when tracing "
                        "(attributes are static), got a traced value")
    return op.attr(name, value)


@functools.lru_cache(maxsize=None)
def _op(name: str) -> _Op:
    return _Op(name)


def _ffi(op: _Op, names: tuple[str, ...], present, attrs: dict):
    """One FFI custom call on the present tensors (named `names`)."""
    by_name = dict(zip(names, present))
    for n, t in by_name.items():  # jax.export's symbolic dimensions: the C++ shape rules need sizes
        if not all(isinstance(d, (int, np.integer)) for d in t.shape):
            raise NotImplementedError(
                f"{op.name}(): '{n}' has shape {tuple(t.shape)} with a symbolic dimension; opforge's shape rules "
                "need concrete sizes (jax.export with symbolic shapes is not supported: export per shape)")
    metas = [(tuple(by_name[n].shape), str(jnp.dtype(by_name[n].dtype))) if n in by_name else None
             for n in op.tensor_names]
    results = [jax.ShapeDtypeStruct(shape, jnp.dtype(dtype)) for shape, dtype, _ in op.core.infer(metas, attrs)]
    mask = sum(1 << i for i, n in enumerate(op.tensor_names) if n in by_name)
    # Results without elements would let XLA drop the call, and with it the check of an argument the
    # op validates (an index's range): marked as having a side effect, the call runs.
    checks_only = all(math.prod(r.shape) == 0 for r in results) and any(
        math.prod(by_name[n].shape) > 0 for n in op.validates if n in by_name)
    call = jax.ffi.ffi_call(_TARGET, results if op.multi else results[0], has_side_effect=checks_only)
    typed = {k: _attr(op.attr_kinds[k], v) for k, v in attrs.items()}
    return call(*present, op=op.name, present=np.int64(mask), **typed)


def _pad_after_batch(x, rank: int):
    """(B, *s) -> (B, 1, ..., 1, *s) with `rank` dims after B, so leading dims broadcast right."""
    return x.reshape((x.shape[0],) + (1,) * (rank - (x.ndim - 1)) + x.shape[1:])


@functools.lru_cache(maxsize=None)
def _primitive(name: str, names: tuple[str, ...], attr_items: tuple):
    """The op on these present tensors and attributes, batching by its declaration."""
    op = _op(name)
    attrs = dict(attr_items)

    @jax.custom_batching.custom_vmap
    def call(*present):
        return _ffi(op, names, present, attrs)

    @call.def_vmap
    def batched(axis_size, in_batched, *present):
        out_batched = [True] * op.core.num_results if op.multi else True
        if all(n in op.leading for n, b in zip(names, in_batched) if b):
            # One call: the batch axis becomes one more leading dimension.
            rank = max(t.ndim - b for n, t, b in zip(names, present, in_batched) if n in op.leading)
            args = [_pad_after_batch(t, rank) if b else t for t, b in zip(present, in_batched)]
            return call(*args), out_batched
        # Other ops see one batch element at a time, in an XLA loop.
        idx = [i for i, b in enumerate(in_batched) if b]

        def one(batch_slices):
            args = list(present)
            for i, s in zip(idx, batch_slices):
                args[i] = s
            return call(*args)

        return jax.lax.map(one, [present[i] for i in idx]), out_batched

    return call


def _zero_cotangent(x):
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, dtype=jax.dtypes.float0)


def _not_differentiable(name: str, prim, why: str = "its declaration names no backward op"):
    """prim, raising the op's own error (torch's wording) when JAX differentiates through it,
    forward or reverse; JAX's would not name the op. (A custom_jvp, not a custom_vjp: JAX would
    skip a vjp rule behind integer results, quantize's, and return zeros.)"""
    @jax.custom_jvp
    def f(*present):
        return prim(*present)

    @f.defjvp
    def jvp(primals, tangents):
        raise RuntimeError(f"{name}() is not differentiable: {why}")

    return f


@functools.lru_cache(maxsize=None)
def _differentiable(name: str, names: tuple[str, ...], attr_items: tuple):
    """_primitive wrapped in a custom_vjp that calls the op's declared backward op."""
    op = _op(name)
    prim = _primitive(name, names, attr_items)
    if op.backward is None:
        return _not_differentiable(name, prim)
    backward_name, differentiable = op.backward
    backward = _op(backward_name)
    attrs = dict(attr_items)

    # Under differentiation the op's saving forward runs instead, if it declares one: the same
    # arguments, the op's result first, then what the backward op takes by those names.
    saving = _primitive(op.core.saving_forward[0], names, attr_items) if op.core.saving_forward else None
    saved_names = op.core.saving_forward[1] if saving else []
    identity = set(op.core.identity_gradient)

    @jax.custom_vjp
    def f(*present):
        return prim(*present)

    # What the forward rule runs: differentiating it again (a second derivative, or forward
    # mode over this rule) has no rule to follow: the op's error, not the FFI call's.
    twice = (f"a second derivative or forward-mode AD would differentiate {backward_name}(), "
             "which has no backward op")
    first = _not_differentiable(name, prim, twice)
    saving = saving and _not_differentiable(name, saving, twice)

    def fwd(*present):
        if saving is None:
            out, saved = first(*present), ()
        else:
            out, *saved = saving(*present)
        return out, (present, out, tuple(saved))

    def bwd(residuals, grad):
        present, out, saved = residuals
        # Gradients that are the cotangent itself (OpDef::identity_gradient): the input matches
        # the result. The backward op runs only if another gradient is needed.
        by_name = {n: grad for n, t in zip(names, present)
                   if n in identity and t.shape == out.shape and t.dtype == out.dtype}
        needed = set(differentiable) & set(names) - set(by_name)
        if needed:
            # The backward op computes only those (its output_mask, OpDef::output_mask_slot).
            mask = sum(1 << i for i, n in enumerate(differentiable) if n in needed)
            values = {**attrs, **dict(zip(names, present)), **dict(zip(saved_names, saved)),
                      "grad": grad, "result": out, "output_mask": mask}
            args = {a["name"]: values.get(a["name"]) for a in backward.args}
            grads = apply(backward_name, **args)
            grads = grads if isinstance(grads, (tuple, list)) else (grads,)
            by_name = {**dict(zip(differentiable, grads)), **by_name}
        return tuple(by_name[n] if n in by_name else _zero_cotangent(t) for n, t in zip(names, present))

    f.defvjp(fwd, bwd)
    return f


# The status code of each kind of opforge error (bindings/jax/ffi_call.cc, status_code).
_ERROR_TYPES = {"INVALID_ARGUMENT": TypeError, "OUT_OF_RANGE": ValueError,
                "UNIMPLEMENTED": NotImplementedError, "FAILED_PRECONDITION": RuntimeError}


def _typed_error(error: Exception) -> Exception:
    """An error a kernel reported through XLA, as the exception the other frontends raise for it
    (the message without XLA's status code); any other error as it is."""
    code, _, message = str(error).partition(": ")
    kind = _ERROR_TYPES.get(code)
    return kind(message) if kind and message.split("(", 1)[0].isidentifier() else error


def apply(name: str, *args, **kwargs):
    """Runs opforge op `name` on JAX arrays (what every generated function calls)."""
    op = _op(name)
    tensors, attrs = op.bind(args, kwargs)
    names = tuple(n for n, t in zip(op.tensor_names, tensors) if t is not None)
    present = [jnp.asarray(t) for t in tensors if t is not None]
    return _differentiable(name, names, tuple(sorted(attrs.items())))(*present)


@functools.lru_cache(maxsize=256)
def _compiled(name: str, names: tuple[str, ...], attr_items: tuple):
    """The op's FFI call on these present tensors and attributes, jitted, for calls on concrete
    arrays: one dispatch of a cached executable, ~10-15 µs on the CPU, where JAX
    evaluating the custom_vjp and its FFI call op by op costs ~1 ms. Nothing here is
    differentiated or batched (a tracer would have taken apply), so neither wrapper is there
    to cost dispatch time. Each new attribute value compiles anew (tens of ms), as under jit;
    the cache is bounded so that a loop over changing values does not keep them all."""
    op = _op(name)
    attrs = dict(attr_items)
    return jax.jit(lambda *present: _ffi(op, names, present, attrs))


def _traced(args, kwargs) -> bool:
    """Whether an argument is a tracer: the call is being traced (jit, grad, vmap, export)."""
    return any(isinstance(a, _Tracer) for a in args) or any(isinstance(a, _Tracer) for a in kwargs.values())


def _make_function(name: str):
    op = _op(name)

    def route(*args, **kwargs):
        if _traced(args, kwargs):  # under jit, grad, vmap, ...
            return apply(name, *args, **kwargs)
        # Concrete arrays: one compiled call (_compiled), bound as under jit: the same checks and
        # messages (a Python float is no array), attributes as plain hashable values.
        tensors, attrs = op.bind(args, kwargs)
        names = tuple(n for n, t in zip(op.tensor_names, tensors) if t is not None)
        try:
            return _compiled(name, names, tuple(sorted(attrs.items())))(*(t for t in tensors if t is not None))
        except jax.errors.JaxRuntimeError as error:  # from the call itself on the CPU; a GPU's come later
            _raise_typed(error)

    # A C++ callable that runs calls on concrete JAX arrays itself (the same jitted call as
    # `route`'s, looked up without binding in Python: half the cost of such a call) and hands
    # every other call (tracers, NumPy arrays, a wrong argument) to `route`.
    function = _core.function(op.core, jax_only=True)
    function._jax_route = route
    function.__name__ = function.__qualname__ = route.__name__ = route.__qualname__ = name
    function.__module__ = __name__
    function.__signature__ = op.signature
    grad_note = (f"Differentiable in {', '.join(op.backward[1])} (backward: {op.backward[0]})."
                 if op.backward else "Not differentiable.")
    function.__doc__ = f"{op.core.schema}\n\n{op.core.doc}\n\nJAX: jit, vmap. {grad_note}"
    return function


def _add_ops(names: list[str]) -> None:
    """opforge.jax.<op> for each of `names`: every op at import, a plugin's (opforge.load_plugin) later."""
    for name in names:
        for arg in _op(name).attr_kinds:
            if arg in _RESERVED:
                raise ImportError(f"opforge.jax: op '{name}' uses the reserved attribute name '{arg}'")
    for name in names:
        globals()[name] = _make_function(name)
        # opforge.<op> given a tracer (under jit, grad, vmap), or JAX arrays only, calls this
        # function instead (bindings/python/function.cc).
        getattr(_opforge, name)._jax_route = globals()[name]


def _raise_typed(error: Exception):
    """Raises a kernel's error from a jitted call as opforge.jax.<op> raises it (_make_function)."""
    raise _typed_error(error) from None


# opforge.<op> hands calls with a tracer to this module, and runs calls on concrete JAX arrays
# through the same jitted calls (_compiled) it makes, bound in C++ (bindings/python/function.cc).
_core._set_jax_hooks(_Tracer, _compiled, _raise_typed, jax.errors.JaxRuntimeError)
_add_ops(_core.op_names())
del _platform, _capsule
