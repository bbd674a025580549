"""Identity gradients (OpDef::identity_gradient): where a declared input has the result's shape
and dtype, its gradient is the cotangent itself, handed through by torch's autograd (C++ and
Python rules) and JAX's custom_vjp without running the backward op; the backward op still runs
for gradients that need it (a broadcast operand's sum)."""

import os
import subprocess
import sys
import weakref

import numpy as np
import pytest
import torch

import opforge
import opforge.torch as ot
from op_samples import CORE, OPS, sample
from opforge.testing import torch_ops_dispatched

IDENTITY = [n for n in OPS if CORE[n].identity_gradient]


def test_declared_where_expected():
    assert CORE["add"].identity_gradient == ["x", "y"]
    assert CORE["add_one"].identity_gradient == ["x"]
    assert not CORE["mul"].identity_gradient
    listed = {op["name"]: op["identity_gradient"] for op in opforge.ops()}
    assert listed["add"] == ["x", "y"] and listed["rms_norm"] == []


@pytest.mark.parametrize("name", IDENTITY)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_the_declaration_holds(name, dtype, rng):
    """The backward op itself returns the cotangent, bit for bit, for every identity input that
    has the result's shape: what the adapters skip is exactly what it would compute."""
    tensors, attrs = sample(name, rng, dtype)
    names = [a["name"] for a in CORE[name].args if a["kind"].startswith("Tensor")]
    result = getattr(torch.ops.opforge, name)(*tensors, **attrs)
    identity = CORE[name].identity_gradient
    tensors = [t.expand(result.shape).contiguous() if n in identity else t for n, t in zip(names, tensors)]
    grad = torch.from_numpy(rng.standard_normal(tuple(result.shape))).to(result.dtype)
    backward, differentiable = CORE[name].backward
    values = {**dict(zip(names, tensors)), "grad": grad, "result": result}
    bwd_args = [a for a in CORE[backward].args if a["name"] in values]
    grads = getattr(torch.ops.opforge, backward)(*(values[a["name"]] for a in bwd_args))
    grads = grads if isinstance(grads, tuple) else (grads,)
    for n, g in zip(differentiable, grads):
        if n in identity:
            assert torch.equal(g, grad), n


def leaves(rng, *shapes):
    return [torch.from_numpy(rng.standard_normal(s)).requires_grad_() for s in shapes]


def test_torch_same_shape_add_passes_the_cotangent(rng):
    x, y = leaves(rng, (6, 9), (6, 9))
    g = torch.from_numpy(rng.standard_normal((6, 9)))
    grads = []
    assert torch_ops_dispatched(lambda: grads.extend(torch.autograd.grad(ot.add(x, y), [x, y], g))) == ["add"]
    for got in grads:
        torch.testing.assert_close(got, g, rtol=0, atol=0)
    assert torch_ops_dispatched(lambda: ot.add_one(x).backward(g)) == ["add_one"]
    torch.testing.assert_close(x.grad, g, rtol=0, atol=0)


def test_torch_broadcast_operand_still_runs_the_backward_op(rng):
    x, b = leaves(rng, (6, 9), (9,))
    g = torch.from_numpy(rng.standard_normal((6, 9)))
    grads = []
    seen = torch_ops_dispatched(lambda: grads.extend(torch.autograd.grad(ot.add(x, b), [x, b], g)))
    assert seen == ["add", "add_backward"]
    torch.testing.assert_close(grads[0], g, rtol=0, atol=0)
    torch.testing.assert_close(grads[1], g.sum(0), rtol=1e-12, atol=1e-12)
    # Only the same-shape operand wanted: no backward op, though the other broadcasts.
    xd = x.detach().requires_grad_()
    gx = []
    assert torch_ops_dispatched(lambda: gx.extend(torch.autograd.grad(ot.add(xd, b.detach()), [xd], g))) == ["add"]
    torch.testing.assert_close(gx[0], g, rtol=0, atol=0)
    # Only the broadcast operand wanted (x has no gradient): the backward op runs.
    assert torch_ops_dispatched(lambda: torch.autograd.grad(ot.add(x.detach(), b), [b], g)) == ["add", "add_backward"]


def test_torch_node_keeps_no_input_alive_when_every_gradient_passes(rng):
    """Like torch's own AddBackward: nothing saved, so activations are freed."""
    a, c = leaves(rng, (4, 5), (4, 5))
    h = a * 2  # MulBackward (by a number) does not save h
    out = ot.add(h, c)
    alive = weakref.ref(h)
    del h
    assert alive() is None
    out.sum().backward()
    torch.testing.assert_close(a.grad, torch.full((4, 5), 2.0, dtype=torch.float64), rtol=0, atol=0)
    # With a broadcast operand the backward op runs, but reads only the shapes (OpDef::shape_only):
    # still no input kept.
    b = leaves(rng, (5,))[0]
    h = a * 2
    out = ot.add(h, b)
    alive = weakref.ref(h)
    del h
    assert alive() is None
    out.sum().backward()
    torch.testing.assert_close(b.grad, torch.full((5,), 4.0, dtype=torch.float64), rtol=0, atol=0)


def test_torch_double_backward_through_add(rng):
    """The passed cotangent stays on the graph (create_graph): second derivatives work."""
    x, y = leaves(rng, (3, 4), (3, 4))
    (gx,) = torch.autograd.grad(ot.add(x, y).square().sum(), [x], create_graph=True)
    torch.testing.assert_close(gx, 2 * (x + y).detach(), rtol=1e-12, atol=1e-12)
    (hxy,) = torch.autograd.grad(gx.sum(), [y])
    torch.testing.assert_close(hxy, torch.full((3, 4), 2.0, dtype=torch.float64), rtol=0, atol=0)


def test_python_autograd_rules_pass_the_cotangent_too():
    """OPFORGE_TORCH_NATIVE=0 (the rules registered in Python): same choices, same gradients."""
    code = """
import torch, opforge.torch as ot
from opforge.testing import torch_ops_dispatched as dispatched
assert not ot.NATIVE_AUTOGRAD
x, y, b = (torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in ((4, 5), (4, 5), (5,)))
g = torch.randn(4, 5, dtype=torch.float64)
grads = []
assert dispatched(lambda: grads.extend(torch.autograd.grad(ot.add(x, y), [x, y], g))) == ["add"]
assert torch.equal(grads[0], g) and torch.equal(grads[1], g)
grads.clear()
assert dispatched(lambda: grads.extend(torch.autograd.grad(ot.add(x, b), [x, b], g))) == ["add", "add_backward"]
assert torch.equal(grads[0], g) and torch.allclose(grads[1], g.sum(0), rtol=1e-12, atol=1e-12)
assert dispatched(lambda: torch.autograd.grad(ot.add(x, b.detach()), [x], g)) == ["add"]
assert torch.autograd.gradcheck(lambda a, c: ot.add(a, c), (x, b))
print("ok")
"""
    env = {**os.environ, "OPFORGE_TORCH_NATIVE": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-4000:]


def test_jax_grad_passes_the_cotangent(rng):
    import jax
    import jax.numpy as jnp

    import opforge.jax as oj

    x, y, b = (jnp.asarray(rng.standard_normal(s)) for s in ((4, 5), (4, 5), (5,)))
    called = lambda op, jaxpr: str(jaxpr).count(f"('op', '{op}')")  # noqa: E731  (the FFI call's attribute)
    loss = lambda x, y: jnp.sum(jnp.sin(oj.add(x, y)))  # noqa: E731
    same = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, y)
    assert called("add", same) == 1 and called("add_backward", same) == 0
    broadcast = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, b)
    assert called("add_backward", broadcast) == 1

    want = lambda x, y: jnp.sum(jnp.sin(x + y))  # noqa: E731
    for a, c in ((x, y), (x, b)):
        for got, ref in zip(jax.jit(jax.grad(loss, argnums=(0, 1)))(a, c), jax.grad(want, argnums=(0, 1))(a, c)):
            np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    one = lambda x: jnp.sum(jnp.sin(oj.add_one(x)))  # noqa: E731
    assert called("add_one_backward", jax.make_jaxpr(jax.grad(one))(x)) == 0
    np.testing.assert_allclose(jax.grad(one)(x), jnp.cos(x + 1), rtol=1e-12, atol=1e-12)


def test_jax_vmap_of_grad_with_an_unbatched_operand(rng):
    """Per example both operands match the result; the unbatched one's cotangent is the sum over
    the batch, as jax.numpy's."""
    import jax
    import jax.numpy as jnp

    import opforge.jax as oj

    xs, y = jnp.asarray(rng.standard_normal((3, 4, 5))), jnp.asarray(rng.standard_normal((4, 5)))
    ours = jax.vmap(jax.grad(lambda x, y: jnp.sum(jnp.sin(oj.add(x, y))), argnums=(0, 1)), in_axes=(0, None))(xs, y)
    want = jax.vmap(jax.grad(lambda x, y: jnp.sum(jnp.sin(x + y)), argnums=(0, 1)), in_axes=(0, None))(xs, y)
    for got, ref in zip(ours, want):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
