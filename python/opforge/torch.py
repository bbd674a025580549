"""opforge ops as PyTorch operators, derived from their declarations: no per-op torch code.

libopforge_torch.so (bindings/torch, LibTorch's stable ABI: one binary for torch 2.11 and later)
defines torch.ops.opforge.<op> from each op's schema, with one generic boxed kernel for CPU
and CUDA tensors. This module loads it (``import opforge`` does, once torch is imported) and
registers, for every op: a fake (meta) kernel from the op's C++ shape rule, so FakeTensor,
meta tensors and torch.compile work and bad inputs fail while tracing with opforge's messages;
autograd through the declared backward op (an op without one raises when differentiated); and
``opforge.torch.<op>(...)`` with the schema's signature, type hints (torch.pyi) and docstring.

Every op also has an out variant, ``torch.ops.opforge.<op>.out(..., *, Tensor(a!) out) -> ()``
(opforge/out.h; one out per result), defined and given CPU and CUDA kernels by the same library.
It returns nothing, so torch.compile functionalizes it (auto_functionalized) and reinplaces it
where it can. Registered here: its fake kernel (the op's, which then checks the outs) and, where
the C++ half is not loaded, its Autograd kernel, which refuses tensors needing a gradient, as
torch's own out= variants do, and bumps the outs' version counters. ``opforge.torch.<op>(...,
out=...)`` calls it (plain CPU tensors through the direct call), and ``opforge.<op>`` given torch
tensors and outs calls that.

What the stable ABI cannot express lives in libopforge_torch_native.so (bindings/torch_native),
built per torch version and loaded only on the torch it was built for: the autograd kernels in
C++ (NATIVE_AUTOGRAD; a Python autograd kernel would cost several microseconds per call) and
the direct call behind opforge.torch.<op>, which runs plain CPU tensors without torch's
dispatcher. On any other torch the same autograd rules are registered in Python and the
functions call the torch op: same results, more overhead per call.

Errors: torch raises every exception from a stable-ABI kernel as RuntimeError. The autograd
kernel (C++ or Python) and the functions here re-raise opforge's errors with their own type
(TypeError, ValueError, NotImplementedError) and message; a torch.ops.opforge call under
torch.inference_mode (no autograd kernel runs) raises RuntimeError with the same message.
Under torch.compile the fake kernel raises, and torch wraps that as it wraps any op's error
while tracing (torch._dynamo.exc.TorchRuntimeError, with opforge's error in the message).
"""

from __future__ import annotations

if __name__ == "__main__":  # python -m opforge.torch: run the imported module (registers once)
    import sys

    import opforge.torch

    sys.exit(opforge.torch._main(sys.argv[1:]))

import collections.abc
import ctypes
import functools
import keyword
import numbers
import os
import sys
import warnings
from pathlib import Path

import torch

import opforge as _opforge  # the package, perhaps still importing: its functions exist

from . import _core

_LIBRARY = Path(__file__).with_name("libopforge_torch.so")
_MIN_TORCH = (2, 11)  # the stable-ABI version the adapter is built for (cmake/torch.cmake)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("+")[0].split(".")[:2] if p.isdigit())


if _version(torch.__version__) < _MIN_TORCH:
    raise ImportError(f"opforge.torch needs torch >= {'.'.join(map(str, _MIN_TORCH))} (the LibTorch stable ABI "
                      f"it is built on); this is torch {torch.__version__}")
if not _LIBRARY.exists():
    raise ImportError("opforge.torch: this opforge was built without the torch adapter (torch was not importable "
                      "at build time); install torch and rebuild opforge (pip install --no-build-isolation .)")
torch.ops.load_library(str(_LIBRARY))
_native = ctypes.CDLL(str(_LIBRARY))  # the same loaded library: its two extern "C" helpers
_native.opforge_torch_registration_errors.restype = ctypes.c_char_p
_native.opforge_torch_error_kind.argtypes = [ctypes.c_char_p]
_native.opforge_torch_error_kind.restype = ctypes.c_int
_native.opforge_torch_register_new_ops.restype = ctypes.c_char_p
if _native.opforge_torch_registration_errors():
    raise ImportError("opforge.torch: " + _native.opforge_torch_registration_errors().decode())

# The torch-version-specific part (bindings/torch_native): autograd kernels in C++. Loaded only
# on the torch it was built against; elsewhere the same rules are registered in Python below.
# OPFORGE_TORCH_NATIVE=0 forces the Python rules (tests use it to cover both).
_NATIVE_LIBRARY = _LIBRARY.with_name("libopforge_torch_native.so")


def _load_native() -> ctypes.CDLL | None:
    version_file = _NATIVE_LIBRARY.with_suffix(".version")
    if os.environ.get("OPFORGE_TORCH_NATIVE", "1") == "0" or not version_file.exists():
        return None
    if version_file.read_text().strip() != torch.__version__:
        return None
    torch.ops.load_library(str(_NATIVE_LIBRARY))
    library = ctypes.CDLL(str(_NATIVE_LIBRARY))
    for name in ("opforge_torch_native_registration_errors", "opforge_torch_native_register_new_ops"):
        getattr(library, name).restype = ctypes.c_char_p
    if library.opforge_torch_native_registration_errors():
        raise ImportError("opforge.torch: " + library.opforge_torch_native_registration_errors().decode())
    return library


_native_library = _load_native()
NATIVE_AUTOGRAD = bool(_native_library)
if NATIVE_AUTOGRAD:
    _direct_call = ctypes.PyDLL(str(_NATIVE_LIBRARY)).opforge_torch_native_direct_call  # PyDLL: holds the GIL
    _direct_call.argtypes = [ctypes.c_char_p, ctypes.py_object]
    _direct_call.restype = ctypes.py_object

_DTYPES = {name: getattr(torch, name) for name in
           ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool")}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
_ERROR_TYPES = (TypeError, ValueError, NotImplementedError)  # opforge::ErrorKind 0, 1, 2


def _reraise(error: RuntimeError):
    """Raises `error` again, as TypeError/ValueError/NotImplementedError if it is an opforge error
    of that kind (the C++ kernel remembers the kinds of the errors it lets torch raise)."""
    if type(error) is RuntimeError:
        kind = _native.opforge_torch_error_kind(str(error).encode())
        if 0 <= kind < len(_ERROR_TYPES):
            raise _ERROR_TYPES[kind](str(error)) from None
    raise error


class _Library(torch.library.Library):
    """A Library whose kernels re-raise opforge's errors with their type. register_autograd
    installs its Python kernel through `lib.impl`, so every eager torch.ops.opforge call with
    autograd enabled passes through here."""

    def impl(self, op_name, fn, dispatch_key="", **kwargs):
        def kernel(*args, **kw):
            try:
                return fn(*args, **kw)
            except RuntimeError as error:
                _reraise(error)

        return super().impl(op_name, kernel, dispatch_key, **kwargs)


_LIB = _Library("opforge", "IMPL")  # must stay alive: its registrations die with it


class _Op:
    """What the torch side needs to know of one op, read once from its declaration."""

    def __init__(self, name: str):
        self.name = name
        # Plain data only: torch keeps the kernels below until the process exits, and a _core.Op
        # held that long shows up in nanobind's leak report at exit.
        core = _core.op(name)
        self.args, self.backward, self.num_results = core.args, core.backward, core.num_results
        self.identity_gradient = set(core.identity_gradient)
        self.shape_only = set(core.shape_only)
        self.autocast = core.autocast
        self.schema, self.doc = core.schema, core.doc
        self.tensor_names = [a["name"] for a in self.args if a["kind"].startswith("Tensor")]
        self.attr_names = [a["name"] for a in self.args if not a["kind"].startswith("Tensor")]
        self.defaults = {a["name"]: a["default"] for a in self.args if a["has_default"]}
        packet = getattr(torch.ops.opforge, name)
        self.overload = packet.default
        # The out variant (opforge/out.h): the op's arguments, then one keyword tensor per result.
        self.out_overload = packet.out if "out" in packet.overloads() else None
        self.out_names = ([a.name for a in self.out_overload._schema.arguments[len(self.args):]]
                          if self.out_overload else [])
        # Its fake kernel (both variants'), which on real tensors allocates results as the kernel's.
        self.allocate = _fake_kernel(self)
        for a in self.args:
            if not a["name"].isidentifier() or keyword.iskeyword(a["name"]):
                raise ImportError(f"opforge.torch: op '{name}' has argument '{a['name']}', not a Python identifier")

    def bind(self, args, kwargs) -> dict:
        """Argument values by name. torch drops trailing arguments equal to their defaults."""
        values = dict(self.defaults)
        values.update(zip((a["name"] for a in self.args), args))
        values.update(kwargs)
        return values


def _hint(size) -> int:
    """A size as an int: a SymInt's example value, without a guard (unbacked ones get guarded)."""
    if isinstance(size, torch.SymInt):
        return size.node.hint if size.node.has_hint() else int(size)
    return size


_PROBE = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29)  # a distinct factor per distinct symbolic size


def _symbolic(shapes, symbols: dict, infer_scaled):
    """Result sizes as SymInts where they follow one symbolic input size.

    The shape rule ran on the sizes' hints; it runs once more with each distinct symbolic size
    scaled by its own prime (scaling keeps divisibility the rule may check; distinct factors
    keep a size computed from one symbol from passing for another). A result size that follows
    a symbol at both points is that SymInt; one that stays put is a constant. Anything else (a
    size computed from symbols, a probe the rule rejects) specializes every symbol: guarded to
    its value, correct, recompiled when it changes.
    """
    probe = {h: h * p for h, p in zip(symbols, _PROBE)}
    try:
        probed = [shape for shape, *_ in infer_scaled(probe)] if len(probe) == len(symbols) else None
    except (TypeError, ValueError, NotImplementedError, RuntimeError):
        probed = None
    out = []
    for k, shape in enumerate(shapes):
        dims = []
        for j, v in enumerate(shape):
            v1 = probed[k][j] if probed and len(probed[k]) == len(shape) else None
            if v1 == v:
                dims.append(v)
            elif v in symbols and v1 == probe[v]:
                dims.append(symbols[v])
            else:
                for sym in symbols.values():
                    int(sym)  # specialize: a guard that it keeps its value
                dims.append(v)
        out.append(dims)
    return out


def _empty_like_layout(shape, dtype, strides, like):
    """An empty result of `shape` (ints or SymInts) whose dimensions lie in memory in the order of
    `strides` (the real kernel's, dense, for the sizes' hints), on `like`'s device.

    Only the order is taken from the hints: a stride order comes from the inputs' own (a
    transpose, a permute in the graph), not from their sizes' values once sizes 0 and 1 are
    specialized, as torch.compile does, so it holds for every size the graph is reused for."""
    device = like.device if like is not None else None
    if list(strides) == _row_major(_hint(s) for s in shape):
        return like.new_empty(shape, dtype=dtype) if like is not None else torch.empty(shape, dtype=dtype)
    # Innermost first; of two dimensions with one stride the size-1 one lies inside (the real
    # strides are products of the sizes inside), so these products give the same strides.
    inner_first = sorted(range(len(shape)), key=lambda d: (strides[d], _hint(shape[d]) != 1))
    out, step = [0] * len(shape), 1
    for d in inner_first:
        out[d], step = step, step * shape[d]
    return torch.empty_strided(shape, out, dtype=dtype, device=device)


def _row_major(shape) -> list[int]:
    out, step = [], 1
    for s in reversed(list(shape)):
        out.append(step)
        step *= s
    return out[::-1]


def _tensor_meta(t, size):
    """A tensor's metadata as the C++ shape rule reads it (devices opforge has no kernels for,
    meta, are not compared; a dtype it lacks is named as torch names it)."""
    return (tuple(size(s) for s in t.shape), _DTYPE_NAMES.get(t.dtype) or str(t.dtype).removeprefix("torch."),
            (t.device.type, t.device.index or 0) if t.device.type in ("cpu", "cuda") else None,
            tuple(_hint(s) for s in t.stride()))


def _fake_kernel(op: _Op):
    """The op's fake (and meta) kernel: the C++ validator and shape rule on the tensors' metadata,
    results on the inputs' device laid out as the real kernel's (row-major, or for elementwise
    ops the inputs' layout, from the strides' hints: opforge/layout.h). With `outs` (the out
    variant's tensors), also what check_out says of them; it then returns nothing."""

    def infer(tensors, attrs, size, outs=None):
        metas = [None if t is None else _tensor_meta(t, size) for t in tensors]
        out_metas = None if outs is None else [None if t is None else _tensor_meta(t, _hint) for t in outs]
        return _core.op(op.name).infer(metas, attrs, out_metas)

    def fake(*args, **kwargs):
        outs = [kwargs.pop(n) for n in op.out_names] if kwargs.keys() & set(op.out_names) else None
        values = op.bind(args, kwargs)
        tensors = [values[n] for n in op.tensor_names]
        for name, t in zip(op.tensor_names, tensors):
            if t is not None and t.dtype not in _DTYPE_NAMES:  # TypeError, as the C++ kernel says it
                _core.op(op.name).fail_unsupported_dtype(name, str(t.dtype).removeprefix("torch."))
        # Real tensors reach this kernel on torch's Meta key, even mixed with CPU ones (whose
        # results it would make, unfilled): every device must agree, as in the C++ validator.
        placed = [(n, t.device) for n, t in zip(op.tensor_names, tensors) if t is not None]
        placed += [(_core.out_name(i, len(outs)), t.device) for i, t in enumerate(outs or ())]
        for name, device in placed[1:]:
            if device != placed[0][1]:
                raise RuntimeError(f"{op.name}(): '{name}' is on {device} but '{placed[0][0]}' is on {placed[0][1]}; "
                                   "all tensors must be on one device")
        attrs = {n: values[n] for n in op.attr_names}
        results = infer(tensors, attrs, _hint, outs)
        if outs is not None:
            return None
        shapes = [shape for shape, *_ in results]
        symbols = {}  # hint -> the first SymInt with that hint
        for s in (s for t in tensors if t is not None for s in t.shape if isinstance(s, torch.SymInt)):
            if s != symbols.setdefault(_hint(s), s):  # a guard, true now: sizes sharing a hint stay equal
                raise AssertionError("unreachable")
        if symbols:
            shapes = _symbolic(shapes, symbols, lambda probe: infer(
                tensors, attrs, lambda s: probe[_hint(s)] if isinstance(s, torch.SymInt) else s))
        present = [t for t in tensors if t is not None]
        outs = [_empty_like_layout(shape, _DTYPES[dtype], strides, present[0] if present else None)
                for shape, (_, dtype, strides) in zip(shapes, results)]
        return outs[0] if len(outs) == 1 else tuple(outs)

    return fake


def _refuse_grad(op: _Op, named_tensors) -> None:
    """out= does not support autograd (as torch's own out= variants): the TypeError every
    frontend raises (opforge/out.h), naming the first tensor that requires grad."""
    if torch.is_grad_enabled():
        for name, t in named_tensors:
            if t is not None and t.requires_grad:
                _core.op(op.name).fail_out_needs_grad(name)


def _out_autograd_kernel(op: _Op):
    """torch.ops.opforge.<op>.out's Autograd kernel where the C++ one is not loaded: refuses
    tensors that require grad, runs the kernel below autograd and marks the outs written (their
    version counters, as torch's own in-place writes do: autograd then refuses a value it saved
    before the write)."""
    below = torch._C._AutoDispatchBelowADInplaceOrView

    def kernel(*args, **kwargs):
        values = op.bind(args, {k: v for k, v in kwargs.items() if k not in op.out_names})
        outs = [kwargs[n] for n in op.out_names]
        _refuse_grad(op, [*((n, values[n]) for n in op.tensor_names),
                          *((_core.out_name(i, len(outs)), t) for i, t in enumerate(outs))])
        with below():
            op.out_overload(*args, **kwargs)
        torch.autograd.graph.increment_version(outs)

    return kernel


def _out_caller(op: _Op):
    """out= of opforge.torch.<op> (and of opforge.<op> given torch tensors, which routes here):
    one tensor, or a tuple or list with a tensor or None (allocate that one) per result, written
    by the out variant and returned as given (a tuple for a sequence, as the generic path)."""
    n = op.num_results
    allocate = op.allocate  # on real tensors, outside fake mode: empty results, laid out as the kernel's
    below = torch._C._AutoDispatchBelowADInplaceOrView
    compiling = torch.compiler.is_compiling
    tensor_slots = [i for i, a in enumerate(op.args) if a["kind"].startswith("Tensor")]

    # The direct call (bindings/torch_native/direct_call.cc) writes plain CPU tensors past
    # torch's dispatcher, as the functions' own; NotImplemented where the out variant must run.
    direct = _direct_call(op.name.encode(), op.overload) if NATIVE_AUTOGRAD else None

    def call(values: tuple, out):
        if direct is not None and n == 1 and type(out) is torch.Tensor and not compiling():
            if direct(*values, out) is None:
                return out
        sequence = isinstance(out, (tuple, list))
        outs = list(out) if sequence else [out]
        if len(outs) != n if sequence else n != 1:  # (dynamo traces this function, not the C++ check)
            _core.op(op.name).check_out_count(sequence, len(outs), type(out).__name__)
        out_names = [f"out[{i}]" for i in range(n)] if sequence else ["out"]  # as the generic path names them
        for name, t in zip(out_names, outs):
            if not (t is None and sequence) and not isinstance(t, torch.Tensor):
                raise TypeError(f"{op.name}(): '{name}' must be a torch tensor, got {type(t).__name__}")
        if any(t is None for t in outs):
            made = allocate(*values)
            made = made if isinstance(made, tuple) else (made,)
            outs = [m if t is None else t for t, m in zip(outs, made)]
        by_name = dict(zip(op.out_names, outs))
        if compiling():  # torch.compile traces the out variant (auto_functionalized)
            op.out_overload(*values, **by_name)
        else:  # what its Autograd kernel does, without the trip through Python it costs
            _refuse_grad(op, [*zip(op.tensor_names, (values[i] for i in tensor_slots)), *zip(out_names, outs)])
            try:
                with below():
                    op.out_overload(*values, **by_name)
            except RuntimeError as error:
                _reraise(error)
            torch.autograd.graph.increment_version(outs)
        return tuple(outs) if sequence else out

    return call


def _output_mask(differentiable, needed) -> int:
    """A backward op's `output_mask` (OpDef::output_mask_slot): bit i set where its result i, the
    gradient of differentiable[i], is needed. (Ignored by backward ops that take no mask.)"""
    return sum(1 << i for i, name in enumerate(differentiable) if name in needed)


def _autograd_rules(op: _Op):
    """(setup_context, backward) calling the declared backward op, its arguments bound by name:
    "grad" is the cotangent, "result" the op's result, any other name the op's argument. These
    rules cannot swap the forward for the op's saving forward (OpDef::saving_forward), so what
    it would save arrives as None (the declaration requires that) and the backward op recomputes it."""
    if op.backward is None:
        def not_differentiable(ctx, *grads):
            raise RuntimeError(f"{op.name}() is not differentiable: its declaration names no backward op")
        return None, not_differentiable
    backward_name, differentiable = op.backward
    if backward_name not in _OPS:
        raise ImportError(f"opforge.torch: {op.name}() declares backward op '{backward_name}', which is not registered")
    bwd = _OPS[backward_name]
    wanted = {a["name"] for a in bwd.args}
    unknown = wanted - {"grad", "result", *(a["name"] for a in op.args), *bwd.defaults}
    if unknown:
        raise ImportError(f"opforge.torch: {backward_name}() takes {sorted(unknown)}, which {op.name}() cannot supply")
    # Arguments the backward op reads only the shape of (OpDef::shape_only) are kept as shapes.
    shape_only = [n for n in op.tensor_names if n in wanted and n in bwd.shape_only]
    saved = [n for n in op.tensor_names if n in wanted and n not in shape_only]
    saved += ["result"] if "result" in wanted else []

    def setup_context(ctx, inputs, output):
        values = op.bind(inputs, {})
        values["result"] = output
        ctx.attrs = {n: values[n] for n in op.attr_names}
        ctx.absent = {n for n in op.tensor_names if values[n] is None}  # torch wants None grads for them
        # Gradients that are the cotangent itself (OpDef::identity_gradient): the input matches
        # the result. If every gradient is, the backward op never runs: nothing to keep alive.
        ctx.passes = {n for n in op.identity_gradient
                      if values[n] is not None and values[n].shape == output.shape and values[n].dtype == output.dtype}
        if not set(differentiable) - ctx.absent <= ctx.passes:
            ctx.save_for_backward(*(values[n] for n in saved))
            ctx.shapes = {n: (values[n].shape, values[n].dtype, values[n].device) for n in shape_only
                          if values[n] is not None}

    def backward(ctx, *grads):
        if len(grads) != 1:
            raise NotImplementedError(f"{op.name}(): backward through an op with several results is not supported yet")
        wanted = {a["name"] for a, needed in zip(op.args, ctx.needs_input_grad) if needed}
        by_name = {n: grads[0] for n in ctx.passes}
        needed = (wanted & set(differentiable)) - ctx.passes
        if needed:
            stand_ins = {n: torch.empty((), dtype=dtype, device=device).expand(shape)  # no storage
                         for n, (shape, dtype, device) in ctx.shapes.items()}
            values = {**bwd.defaults, **ctx.attrs, **dict(zip(saved, ctx.saved_tensors)), **stand_ins,
                      "grad": grads[0], "output_mask": _output_mask(differentiable, needed)}
            result = bwd.overload(*(values[a["name"]] for a in bwd.args))
            results = result if isinstance(result, tuple) else (result,)
            by_name = {**{n: g for n, g in zip(differentiable, results) if n in needed}, **by_name}
        return tuple(None if a["name"] in ctx.absent else by_name.get(a["name"]) for a in op.args)

    return setup_context, backward


try:  # torch.ops takes numpy.bool_ for a bool; torch runs without NumPy too
    import numpy as _numpy

    _NUMPY_BOOL: type = _numpy.bool_
except ImportError:
    _NUMPY_BOOL = bool


# Per schema kind: annotation, a test that is true for a wrong value of argument {n}, and what
# the error says was expected (the generic adapter's wording).
_KINDS = {
    "Tensor": ("Tensor", "not isinstance({n}, Tensor)", "a Tensor"),
    "Tensor?": ("Tensor | None", "{n} is not None and not isinstance({n}, Tensor)", "a Tensor or None"),
    # NumPy scalars too (numbers.Real / Integral, checked last: the plain types are the fast path)
    "float": ("float", "isinstance({n}, bool) or not isinstance({n}, (float, int, SymFloat, SymInt, Real))", "a float"),
    "int": ("int", "isinstance({n}, bool) or not isinstance({n}, (int, SymInt, Integral))", "an int"),
    "bool": ("bool", "not isinstance({n}, (bool, SymBool, NumpyBool))", "a bool"),
    "str": ("str", "not isinstance({n}, str)", "a str"),
}


def _signature_text(op: _Op) -> str:
    params = [f"{a['name']}: {_KINDS[a['kind']][0]}" + (f" = {a['default']!r}" if a["has_default"] else "")
              for a in op.args]
    n = op.num_results
    if op.out_overload:  # one tensor, or one (or None) per result
        params += ["*", f"out: {'Tensor' if n == 1 else 'Sequence[Tensor | None]'} | None = None"]
    return f"{op.name}({', '.join(params)}) -> {'Tensor' if n == 1 else 'tuple[' + ', '.join(['Tensor'] * n) + ']'}"


def _make_function(op: _Op):
    """opforge.torch.<op>: the schema's signature as real Python parameters (so Python itself
    binds them), argument kinds checked, then one call of the torch op. Generated source, not a
    *args wrapper, because binding by hand would cost more than the op's own dispatch."""
    names = ", ".join(a["name"] for a in op.args)
    checks = "".join(f"    if {_KINDS[a['kind']][1].format(n=a['name'])}:\n"
                     f"        __bad({a['name']!r}, {_KINDS[a['kind']][2]!r}, {a['name']})\n" for a in op.args)
    if NATIVE_AUTOGRAD:
        # The direct call (bindings/torch_native/direct_call.cc) runs plain CPU tensors without
        # torch's dispatcher and hands everything else to the op; errors from the op still
        # need their type back under inference_mode (no autograd kernel to restore it).
        body = (f"    if __compiling():  # torch.compile traces the op itself\n"
                f"        return __op({names})\n"
                f"    try:\n        return __direct({names})\n"
                f"    except RuntimeError as error:\n        __reraise(error)\n")
    else:
        # Without a gradient to track, the call skips the Python autograd kernel (most of the
        # cost of a small call) the way that kernel itself would: below autograd, the same kernel.
        grad = " or ".join(f"({n} is not None and {n}.requires_grad)" for n in op.tensor_names) or "False"
        body = (f"    if __compiling():  # torch.compile traces the op itself; errors come from its fake kernel\n"
                f"        return __op({names})\n"
                f"    try:\n"
                f"        if __grad_enabled() and ({grad}):\n            return __op({names})\n"
                f"        with __below_autograd():\n            return __op({names})\n"
                f"    except RuntimeError as error:\n        __reraise(error)\n")
    if op.out_overload:
        values = f"({names}{',' if len(op.args) == 1 else ''})"  # a tuple, of one argument too
        body = f"    if out is not None:\n        return __out({values}, out)\n" + body
    source = f"def {_signature_text(op)}:\n{checks}{body}"

    def bad(name, expected, value):
        raise TypeError(f"{op.name}(): '{name}' must be {expected}, got {type(value).__name__}")

    namespace = {"Tensor": torch.Tensor, "SymInt": torch.SymInt, "SymFloat": torch.SymFloat,
                 "Real": numbers.Real, "Integral": numbers.Integral, "NumpyBool": _NUMPY_BOOL,
                 "SymBool": torch.SymBool, "__op": op.overload, "__bad": bad, "__reraise": _reraise,
                 "__direct": _direct_call(op.name.encode(), op.overload) if NATIVE_AUTOGRAD else None,
                 "__out": _out_caller(op) if op.out_overload else None, "Sequence": collections.abc.Sequence,
                 "__compiling": torch.compiler.is_compiling, "__grad_enabled": torch.is_grad_enabled,
                 "__below_autograd": torch._C._AutoDispatchBelowAutograd}
    exec(compile(source, f"<opforge.torch.{op.name}>", "exec"), namespace)
    function = namespace[op.name]
    function.__module__ = __name__
    grad = (f"Differentiable in {', '.join(op.backward[1])} (backward: {op.backward[0]})"
            if op.backward else "Not differentiable")
    function.__doc__ = (f"{op.schema}\n\n{op.doc}\n\nPyTorch: torch.ops.opforge.{op.name}, "
                        f"torch.compile, FakeTensor. {grad}.")
    return function


def _autocast_kernel(op: _Op, device_type: str | None, key: str):
    """The op's cast policy (OpDef::autocast) under torch.autocast(device_type) (None: the
    PrivateUse1 device, named when the call comes), in Python: what
    bindings/torch_native/autocast.cc does where the C++ half of the adapter is not loaded."""
    below = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))

    def kernel(*args, **kwargs):
        device = device_type or torch._C._get_privateuse1_backend_name()

        def castable(a):
            return isinstance(a, torch.Tensor) and a.is_floating_point() and a.device.type == device

        values = [*args, *kwargs.values()]
        if op.autocast == "lower_precision":
            to = torch.get_autocast_dtype(device)
        elif op.autocast == "fp32":
            to = torch.float32
        else:  # promote: the widest floating dtype among the tensors
            floating = [a.dtype for a in values if castable(a)]
            to = functools.reduce(torch.promote_types, floating) if floating else None

        def cast(a):  # float64 stays, as in torch's autocast
            return a.to(to) if to is not None and castable(a) and a.dtype != torch.float64 else a

        with torch._C._ExcludeDispatchKeyGuard(below):
            return op.overload(*map(cast, args), **{k: cast(v) for k, v in kwargs.items()})

    return kernel


def _register_autocast(op: _Op) -> None:
    if op.autocast == "none":
        return
    for device_type, key in (("cpu", "AutocastCPU"), ("cuda", "AutocastCUDA"), (None, "AutocastPrivateUse1")):
        _LIB.impl(op.name, _autocast_kernel(op, device_type, key), key)


def _stub_text() -> str:
    """The type stub of this module (torch.pyi), from the op registry."""
    lines = ["# Generated from the op registry by `python -m opforge.torch --write-stub`; do not edit.",
             "from collections.abc import Sequence", "", "from torch import Tensor", ""]
    lines += [f"def {_signature_text(op)}: ..." for op in _OPS.values()]
    return "\n".join(lines) + "\n"


def _register(names: list[str]) -> None:
    """The Python side of ops torch.ops.opforge already defines: fake kernels, autograd rules
    (where the C++ ones are not loaded) and the opforge.torch functions."""
    ops = {name: _Op(name) for name in names}
    _OPS.update(ops)  # first: an op's backward op may be among them
    for op in ops.values():
        torch.library.register_fake(op.overload, op.allocate, lib=_LIB)
        if op.out_overload:
            torch.library.register_fake(op.out_overload, op.allocate, lib=_LIB)
            if not NATIVE_AUTOGRAD:  # else bindings/torch_native/autograd.cc's OutAutogradKernel
                _LIB.impl(op.out_overload, _out_autograd_kernel(op), "Autograd")
        setup_context, backward = _autograd_rules(op)
        if not NATIVE_AUTOGRAD:
            torch.library.register_autograd(op.overload, backward, setup_context=setup_context, lib=_LIB)
            _register_autocast(op)
        globals()[op.name] = _make_function(op)
        # opforge.<op> given torch tensors only calls this function (bindings/python/function.cc).
        getattr(_opforge, op.name)._torch_route = globals()[op.name]
    if "torch._dynamo" in sys.modules:
        _trace_generic_functions(list(ops))


def _trace_generic_functions(names: list[str]) -> None:
    """Lets torch.compile take opforge.<op> (C++, which dynamo cannot look into) into its graph
    as a call (allow_in_graph); AOTAutograd then traces that call, on fake tensors, to the torch
    op it routes them to, so the compiled graph holds torch.ops.opforge.<op>, fullgraph=True
    included. Registered when dynamo loads (importing it costs seconds), for the ops then
    known; a plugin's as it loads. A dynamo that refuses costs a warning, not the import."""
    try:
        for name in names:
            torch.compiler.allow_in_graph(getattr(_opforge, name))
            # out=(t, None): the results to allocate, from the fake kernel (C++: dynamo cannot trace it).
            torch.compiler.allow_in_graph(_OPS[name].allocate)
    except (TypeError, ValueError, ImportError, AttributeError) as error:
        warnings.warn(f"opforge: torch.compile cannot trace opforge.<op> (use opforge.torch.<op>): {error}",
                      stacklevel=2)


def _add_ops(names: list[str]) -> None:
    """Makes ops a plugin added after this module loaded (opforge.load_plugin) torch operators
    like the rest: defined with CPU and CUDA kernels, C++ autograd where loaded, then the above."""
    errors = _native.opforge_torch_register_new_ops()
    if not errors and NATIVE_AUTOGRAD:
        errors = _native_library.opforge_torch_native_register_new_ops()
    if errors:
        raise RuntimeError("opforge.torch: " + errors.decode())
    _register(names)


_OPS: dict[str, _Op] = {}
_register(_core.op_names())
if "torch._dynamo" not in sys.modules:
    _opforge._when_imported("torch._dynamo", lambda: _trace_generic_functions(list(_OPS)))


def _main(argv: list[str]) -> int:
    """python -m opforge.torch --write-stub [PATH]: regenerates the type stub (run from the repo root)."""
    if not argv or argv[0] != "--write-stub":
        print("usage: python -m opforge.torch --write-stub [PATH (default python/opforge/torch.pyi)]")
        return 2
    path = Path(argv[1] if len(argv) > 1 else "python/opforge/torch.pyi")
    path.write_text(_stub_text())
    print(f"wrote {path} ({len(_OPS)} ops)")
    return 0
