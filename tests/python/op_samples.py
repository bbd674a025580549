"""Torch inputs for any op, shared by the torch adapter's tests and the forge device's: from each
op's reference sample (opforge.references.<name>.sample); a saving forward (linear_act_with_preact)
takes its op's sample; a backward op without one is fed from its forward op's sample, the
cotangent drawn like the forward result, saved results from the saving forward."""

import importlib

import numpy as np
import pytest
import torch

import opforge

OPS = opforge._core.op_names()
CORE = {name: opforge._core.op(name) for name in OPS}
FORWARD_OF = {CORE[n].backward[0]: n for n in OPS if CORE[n].backward}
SAVING_OF = {CORE[n].saving_forward[0]: n for n in OPS if CORE[n].saving_forward}
WITH_REFERENCE = [n for n in OPS if importlib.util.find_spec(f"opforge.references.{n}") is not None]


def reference(name):
    return importlib.import_module(f"opforge.references.{name}")


def tensor_names(name):
    return [a["name"] for a in CORE[name].args if a["kind"].startswith("Tensor")]


def dtypes(name):
    return next(a for a in CORE[name].args if a["kind"].startswith("Tensor"))["dtypes"]


def backward_values(forward, args, attrs, rng):
    """What the backward op of `forward` may take, by name, for these arguments: the arguments,
    "result" and the saved results (from the saving forward where the op declares one), and a
    random cotangent "grad" like the result."""
    saving = CORE[forward].saving_forward
    if saving:
        result, *saved = getattr(torch.ops.opforge, saving[0])(*args, **attrs)
        values = dict(zip(saving[1], saved))
    else:
        result, values = getattr(torch.ops.opforge, forward)(*args, **attrs), {}
    grad = torch.from_numpy(rng.standard_normal(tuple(result.shape))).to(result.dtype).to(result.device)
    return {**dict(zip(tensor_names(forward), args)), **values, "result": result, "grad": grad}


def significant(t) -> tuple:
    """A tensor's strides where they mean something: dimensions longer than 1."""
    return tuple(s for s, n in zip(t.stride(), t.shape) if n > 1)


def torch_strides(name, tensors) -> tuple:
    """The strides (on dimensions longer than 1) torch gives the result of its own elementwise ops
    on these operands (torch._prims_common's rule, TensorIterator's), which an elementwise
    opforge op's result must have; row-major strides for any other op."""
    import torch._prims_common as prims

    operands = [t for t, n in zip(tensors, tensor_names(name)) if n in CORE[name].elementwise]
    if not operands:
        return None
    expanded = torch.broadcast_tensors(*operands)
    strides = prims.compute_elementwise_output_strides(*expanded)
    return tuple(s for s, n in zip(strides, expanded[0].shape) if n > 1)


def sample(name, rng, dtype, rows=5, cols=33, grad=False, device="cpu"):
    """(tensors in schema order, attrs) for `name` in `dtype` on `device`; with grad, the
    declared differentiable inputs require grad."""
    if name in WITH_REFERENCE:
        arrays, attrs = reference(name).sample(rng, rows=rows, cols=cols)

        def convert(a):  # float64 data becomes `dtype`; indices and such keep their own dtype
            a = np.asarray(a)
            if a.dtype != np.float64:
                return torch.from_numpy(a)
            if dtype.startswith("int"):
                a = rng.integers(-1000, 1000, a.shape)
            return torch.from_numpy(a).to(getattr(torch, dtype))

        tensors = [convert(a).to(device) for a in arrays]
    elif name in SAVING_OF:
        tensors, attrs = sample(SAVING_OF[name], rng, dtype, rows, cols, device=device)
    elif name in FORWARD_OF:
        forward = FORWARD_OF[name]
        args, attrs = sample(forward, rng, dtype, rows, cols, device=device)
        values = backward_values(forward, args, attrs, rng)
        tensors = [values[n] for n in tensor_names(name)]
        taken = {a["name"] for a in CORE[name].args}  # scatter_add_backward takes dim, not dim_size
        attrs = {k: v for k, v in attrs.items() if k in taken}
    else:
        pytest.skip(f"{name} has no reference and is no op's backward")
    wanted = CORE[name].backward[1] if grad and CORE[name].backward else []
    for n, t in zip(tensor_names(name), tensors):
        t.requires_grad_(n in wanted)
    return tensors, attrs


def check_grads_against_reference(fn, name, rng):
    """fn (an entry point of op `name`: opforge.torch.<op>, opforge.<op>) differentiated in float64
    against the op's torch reference, a tight bar; returns the inputs and fn's result."""
    tensors, attrs = sample(name, rng, "float64", rows=4, cols=9, grad=True)
    copies = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    got = fn(*tensors, **attrs)
    got.sin().sum().backward()
    reference(name).torch(*copies, **attrs).sin().sum().backward()
    for t, c in zip(tensors, copies):
        assert (t.grad is None) == (c.grad is None)
        if t.grad is not None:
            torch.testing.assert_close(t.grad, c.grad, rtol=1e-10, atol=1e-12)
    return tensors, attrs, got
