"""Output masks (OpDef::output_mask_slot): a backward op that takes `int output_mask=-1` computes
only the results whose bit is set, the others come back empty; the adapters (torch's C++ node,
torch's Python rules, JAX's custom_vjp) ask for the gradients autograd wants, so the first
layer's grad_x, a frozen weight's grad_weight or an operand's passed-through cotangent is never
computed. Every asked-for result must be bitwise what the full call returns."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import opforge
import opforge.torch as ot
from op_samples import CORE, OPS
from opforge.testing import torch_ops_dispatched

MASKED = [n for n in OPS if any(a["name"] == "output_mask" for a in CORE[n].args)]
DTYPES = ["float32", "float64", "bfloat16"]


def test_every_backward_op_with_several_results_takes_a_mask():
    """Otherwise the adapters would compute gradients nobody wants (a frozen weight's)."""
    several = {CORE[n].backward[0] for n in OPS if CORE[n].backward and len(CORE[n].backward[1]) > 1}
    assert several and several <= set(MASKED)
    assert set(MASKED) == {"add_backward", "mul_backward", "linear_act_backward", "layer_norm_backward",
                           "rms_norm_backward"}
    for name in MASKED:
        (arg,) = [a for a in CORE[name].args if a["name"] == "output_mask"]
        assert arg["kind"] == "int" and arg["default"] == -1


def arrays(rng, dtype, shapes):
    return [torch.from_numpy(rng.standard_normal(s)).to(getattr(torch, dtype)) for s in shapes]


def strided(t):
    """t's values in a non-contiguous tensor (every other column of a wider one)."""
    wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


def cases(name, rng, dtype):
    """(label, tensors, attrs) covering each backward op's code paths: same shapes and
    broadcasts, activations, with and without saved results, strided inputs, a large row count."""
    if name in ("add_backward", "mul_backward"):
        for shapes in [((3, 5, 6), (3, 5, 6), (3, 5, 6)), ((3, 5, 6), (3, 1, 6), (5, 6)), ((4, 7), (), (4, 7)),
                       ((0, 3), (0, 3), (3,))]:
            yield str(shapes), arrays(rng, dtype, shapes), {}
        g, x, y = arrays(rng, dtype, [(5, 9), (5, 9), (5, 9)])
        yield "strided", [strided(g), strided(x), y], {}
    elif name == "linear_act_backward":
        for act in ("none", "relu", "gelu_tanh"):
            g, x, w, b = arrays(rng, dtype, [(2, 3, 4), (2, 3, 5), (4, 5), (4,)])
            yield f"{act}", [g, x, w, b, None], {"act": act}
            z = torch.nn.functional.linear(x.double(), w.double(), b.double()).to(x.dtype)
            yield f"{act} preact", [g, x, w, b, z], {"act": act}
            yield f"{act} no bias, strided", [g, strided(x), w, None, None], {"act": act}
        g, x, w = arrays(rng, dtype, [(0, 4), (0, 5), (4, 5)])
        yield "no rows", [g, x, w, None, None], {}
    else:  # layer_norm_backward, rms_norm_backward
        for rows, cols in [(7, 33), (1, 1), (0, 8), (520, 4100)]:  # the last streams grad_x (8 MB in float32)
            g, x, w = arrays(rng, dtype, [(rows, cols), (rows, cols), (cols,)])
            yield f"{rows}x{cols}", [g, x, w], {"eps": 1e-5}
        g, x, w = arrays(rng, dtype, [(6, 10), (6, 10), (10,)])
        yield "strided", [strided(g), strided(x), w], {"eps": 1e-5}


@pytest.mark.parametrize("name", MASKED)
@pytest.mark.parametrize("dtype", DTYPES)
def test_each_mask_computes_exactly_its_results(name, dtype, rng):
    op = getattr(torch.ops.opforge, name)
    count = CORE[name].num_results
    for label, tensors, attrs in cases(name, rng, dtype):
        full = op(*tensors, **attrs)
        for mask in range(1 << count):
            got = op(*tensors, **attrs, output_mask=mask)
            for i in range(count):
                if mask >> i & 1:
                    assert torch.equal(got[i], full[i]), f"{label}: mask {mask:b}, result {i}"
                else:
                    assert got[i].shape == (0,) and got[i].dtype == full[i].dtype, f"{label}: mask {mask:b}"


@pytest.mark.parametrize("name", MASKED)
def test_numpy_and_jax_frontends_take_the_mask(name, rng):
    import jax.numpy as jnp

    import opforge.jax as oj

    _, tensors, attrs = next(cases(name, rng, "float64"))
    numpy_args = [None if t is None else t.numpy() for t in tensors]
    full = getattr(opforge, name)(*numpy_args, **attrs)
    got = getattr(opforge, name)(*numpy_args, **attrs, output_mask=1)
    np.testing.assert_array_equal(got[0], full[0])
    assert all(r.shape == (0,) for r in got[1:])
    # JAX's arrays live on its default device (a GPU where there is one): its full call is the
    # reference there, and NumPy's within rounding (a GPU sums in another order).
    jax_args = [None if a is None else jnp.asarray(a) for a in numpy_args]
    jax_full = getattr(oj, name)(*jax_args, **attrs)
    jax_got = getattr(oj, name)(*jax_args, **attrs, output_mask=2)
    np.testing.assert_array_equal(np.asarray(jax_got[1]), np.asarray(jax_full[1]))
    np.testing.assert_allclose(np.asarray(jax_full[1]), full[1], rtol=1e-12, atol=1e-12)
    assert jax_got[0].shape == (0,)


@pytest.mark.parametrize("mask", [-2, 4, 2**40])
def test_a_mask_outside_the_results_is_a_value_error(mask, rng):
    g, x, y = arrays(rng, "float32", [(2, 3), (2, 3), (3,)])
    message = r"add_backward\(\): 'output_mask' must be -1 \(every result\) or a bit mask of its 2 results in \[0, 3\]"
    with pytest.raises(ValueError, match=message):
        opforge.add_backward(g.numpy(), x.numpy(), y.numpy(), output_mask=mask)
    with pytest.raises(ValueError, match=message):
        torch.ops.opforge.add_backward(g, x, y, output_mask=mask)


def masks_sent(fn):
    """Runs fn() and returns {backward op: output_mask} for the masked backward ops it sent
    through torch's dispatcher."""
    return {name: bound.get("output_mask", -1) for name, bound in torch_ops_dispatched(fn, arguments=True)
            if name in MASKED}


def leaf(rng, shape, wanted):
    return torch.from_numpy(rng.standard_normal(shape)).requires_grad_(wanted)


# (op, input shapes, torch reference, backward op, {which inputs want a gradient: expected mask})
TRAINING = [
    ("linear_act", [(6, 5), (4, 5), (4,)], lambda x, w, b: torch.relu(torch.nn.functional.linear(x, w, b)),
     {(False, True, True): 0b110, (True, False, False): 0b001, (False, False, True): 0b100,
      (True, True, True): 0b111}),
    ("layer_norm", [(6, 5), (5,), (5,)], lambda x, w, b: torch.nn.functional.layer_norm(x, (5,), w, b),
     {(True, False, False): 0b001, (False, True, False): 0b010, (True, False, True): 0b101}),
    ("rms_norm", [(6, 5), (5,)], lambda x, w: x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * w,
     {(True, False): 0b01, (False, True): 0b10}),
    ("mul", [(6, 5), (5,)], lambda x, y: x * y, {(True, False): 0b01, (False, True): 0b10, (True, True): 0b11}),
    ("add", [(6, 5), (5,)], lambda x, y: x + y, {(True, True): 0b10, (False, True): 0b10}),
]
ATTRS = {"linear_act": {"act": "relu"}}


@pytest.mark.parametrize("case", TRAINING, ids=[c[0] for c in TRAINING])
def test_torch_asks_only_for_the_wanted_gradients(case, rng):
    name, shapes, reference, expected = case
    for wanted, mask in expected.items():
        inputs = [leaf(rng, s, w) for s, w in zip(shapes, wanted)]
        wrt = [t for t in inputs if t.requires_grad]
        g = torch.from_numpy(rng.standard_normal(tuple(reference(*inputs).shape)))
        grads = []
        sent = masks_sent(lambda: grads.extend(
            torch.autograd.grad(getattr(ot, name)(*inputs, **ATTRS.get(name, {})), wrt, g)))
        assert sent == {CORE[name].backward[0]: mask}, wanted
        for got, want in zip(grads, torch.autograd.grad(reference(*inputs), wrt, g)):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_linear_act_without_bias_never_computes_grad_bias(rng):
    x, w = leaf(rng, (3, 5), True), leaf(rng, (4, 5), True)
    assert masks_sent(lambda: ot.linear_act(x, w).sum().backward()) == {"linear_act_backward": 0b011}
    assert w.grad.shape == (4, 5) and x.grad.shape == (3, 5)


def test_torch_compile_traces_the_mask(rng):
    """AOTAutograd traces the backward with fake tensors: the shape rule's empty results must
    match the kernel's, and the compiled gradients the eager ones."""
    x, w, b = leaf(rng, (6, 5), False), leaf(rng, (4, 5), True), leaf(rng, (4,), True)
    step = torch.compile(lambda x, w, b: ot.linear_act(x, w, b, act="gelu").square().sum(), fullgraph=True,
                         backend="aot_eager")
    got = torch.autograd.grad(step(x, w, b), [w, b])
    want = torch.autograd.grad(torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)).square().sum(), [w, b])
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-10)


def test_python_autograd_rules_ask_for_the_wanted_gradients_too():
    """OPFORGE_TORCH_NATIVE=0 (the rules registered in Python): the same masks."""
    code = """
import torch, opforge.torch as ot
import test_output_mask as t
assert not ot.NATIVE_AUTOGRAD
x, w, b = (torch.randn(*s, dtype=torch.float64) for s in ((6, 5), (4, 5), (4,)))
w.requires_grad_()
assert t.masks_sent(lambda: ot.linear_act(x, w, b, act="relu").sum().backward()) == {"linear_act_backward": 0b010}
torch.testing.assert_close(w.grad, torch.relu(x @ w.detach().T + b).gt(0).double().T @ x)
x.requires_grad_()
b2 = torch.randn(5, dtype=torch.float64, requires_grad=True)
assert t.masks_sent(lambda: ot.add(x, b2).sum().backward()) == {"add_backward": 0b10}
assert torch.equal(x.grad, torch.ones_like(x)) and torch.equal(b2.grad, torch.full_like(b2, 6.0))
print("ok")
"""
    env = {**os.environ, "OPFORGE_TORCH_NATIVE": "0",
           "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-4000:]


def test_jax_asks_only_for_gradients_not_passed_through(rng):
    """JAX's custom_vjp cannot tell which cotangents are wanted (it wants all), but an operand
    whose gradient is the cotangent itself (add's same-shape x) and an absent bias are left out."""
    import jax
    import jax.numpy as jnp

    import opforge.jax as oj

    x, b = jnp.asarray(rng.standard_normal((4, 5))), jnp.asarray(rng.standard_normal(5))
    w = jnp.asarray(rng.standard_normal((3, 5)))
    found = r"'output_mask', (?:np\.int64\()?(\d+)"  # an FFI call's attribute, as the jaxpr prints it
    mask_in = lambda jaxpr: {int(m) for m in re.findall(found, str(jaxpr))}  # noqa: E731
    loss = lambda x, b: jnp.sum(jnp.sin(oj.add(x, b)))  # noqa: E731
    assert mask_in(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, b)) == {0b10}
    for got, want in zip(jax.jit(jax.grad(loss, argnums=(0, 1)))(x, b),
                         jax.grad(lambda x, b: jnp.sum(jnp.sin(x + b)), argnums=(0, 1))(x, b)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    no_bias = lambda x, w: jnp.sum(oj.linear_act(x, w, act="relu") ** 2)  # noqa: E731
    assert mask_in(jax.make_jaxpr(jax.grad(no_bias, argnums=(0, 1)))(x, w)) == {0b011}
    want = jax.grad(lambda x, w: jnp.sum(jax.nn.relu(x @ w.T) ** 2), argnums=(0, 1))(x, w)
    for got, ref in zip(jax.grad(no_bias, argnums=(0, 1))(x, w), want):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
