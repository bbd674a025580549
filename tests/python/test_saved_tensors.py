"""What autograd keeps for an op's backward: relu keeps its result, not its input (as torch's
ReluBackward); add with a broadcast operand keeps no operand at all, only shapes, since
add_backward reads nothing else of them (OpDef::shape_only). So the inputs are freed after the
forward, and changing them in place afterwards is no error, as with torch's own ops; in torch's
C++ autograd node, in the Python rules, under torch.compile and on the forge device."""

import gc
import os
import subprocess
import sys
import weakref

import numpy as np
import pytest
import torch

import opforge
import opforge.torch as ot
from opforge.testing import FORGE_BESIDE_A_GPU, forge_testable
from op_samples import CORE, OPS


def test_shape_only_is_declared_where_expected():
    assert CORE["add_backward"].shape_only == ["x", "y"]
    assert [n for n in OPS if CORE[n].shape_only] == ["add_backward"]
    assert {op["name"]: op["shape_only"] for op in opforge.ops()}["add_backward"] == ["x", "y"]


@pytest.mark.parametrize("shapes", [((3, 5, 6), (3, 1, 6)), ((4, 7), ()), ((2, 3), (2, 3))], ids=str)
def test_add_backward_reads_only_the_shapes(shapes, rng):
    """The declaration holds: NaN-filled operands, or broadcast stand-ins without storage, give
    the same gradients bit for bit."""
    x, y = (torch.from_numpy(rng.standard_normal(s)).float() for s in shapes)
    grad = torch.from_numpy(rng.standard_normal(tuple(torch.broadcast_shapes(x.shape, y.shape)))).float()
    want = torch.ops.opforge.add_backward(grad, x, y)
    for a, b in [(torch.full_like(x, torch.nan), torch.full_like(y, torch.nan)),
                 (torch.empty(()).expand(x.shape), torch.empty(()).expand(y.shape))]:
        got = torch.ops.opforge.add_backward(grad, a, b)
        assert all(torch.equal(g, w) for g, w in zip(got, want))


def leaf(rng, *shape):
    return torch.from_numpy(rng.standard_normal(shape)).requires_grad_()


# (op, the input shapes, the torch reference); the first input is the one changed and dropped
CASES = {
    "relu": ([(4, 5)], torch.relu),
    "add with a broadcast operand": ([(4, 5), (5,)], torch.add),
    "add with a broadcast first operand": ([(5,), (4, 5)], torch.add),
}
OURS = {"relu": ot.relu, "add with a broadcast operand": ot.add, "add with a broadcast first operand": ot.add}


@pytest.mark.parametrize("case", list(CASES))
def test_inputs_changed_in_place_after_the_forward(case, rng):
    shapes, reference = CASES[case]
    leaves = [leaf(rng, *s) for s in shapes]
    g = torch.from_numpy(rng.standard_normal(tuple(reference(*leaves).shape)))
    want = torch.autograd.grad(reference(*leaves), leaves, g)
    inputs = [t * 1.0 for t in leaves]  # non-leaves: those may change in place
    out = OURS[case](*inputs)
    inputs[0].add_(100.0)  # torch's own op does not mind: opforge's must not either
    got = torch.autograd.grad(out, leaves, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", list(CASES))
def test_inputs_are_freed_after_the_forward(case, rng):
    shapes, _ = CASES[case]
    leaves = [leaf(rng, *s) for s in shapes]
    inputs = [t * 1.0 for t in leaves]
    alive = weakref.ref(inputs[0])
    out = OURS[case](*inputs)
    del inputs
    gc.collect()
    assert alive() is None
    out.sum().backward()
    assert all(t.grad is not None for t in leaves)


def test_torch_compile_with_dynamic_shapes(rng):
    """The stand-in's sizes are symbolic under torch.compile: one graph serves every size."""
    torch._dynamo.reset()
    f = torch.compile(lambda a, c: ot.add(a, c).sin().sum(), backend="aot_eager", dynamic=True, fullgraph=True)
    for n in (3, 7, 11):
        a, c = leaf(rng, n, 5), leaf(rng, 5)
        got = torch.autograd.grad(f(a, c), [a, c])
        want = torch.autograd.grad((a + c).sin().sum(), [a, c])
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


def test_forge_device(rng):
    if not forge_testable():
        pytest.skip(FORGE_BESIDE_A_GPU)
    import opforge.forge  # noqa: F401  (registers the device)

    x, b = (torch.from_numpy(rng.standard_normal(s)).float() for s in ((4, 5), (5,)))
    xf, bf = x.to("forge").requires_grad_(), b.to("forge").requires_grad_()
    h = xf * 1.0
    out = ot.add(h, bf)
    h.add_(1.0)
    out.square().sum().backward()
    xc, bc = x.clone().requires_grad_(), b.clone().requires_grad_()
    (xc + bc).square().sum().backward()
    torch.testing.assert_close(xf.grad.cpu(), xc.grad)
    torch.testing.assert_close(bf.grad.cpu(), bc.grad)


def test_python_autograd_rules_keep_the_same():
    """OPFORGE_TORCH_NATIVE=0 (the rules registered in Python)."""
    code = """
import gc, weakref, torch, opforge.torch as ot
assert not ot.NATIVE_AUTOGRAD
x, b = (torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in ((4, 5), (5,)))
for f, args in ((ot.relu, (x,)), (ot.add, (x, b))):
    h = x * 1.0
    alive = weakref.ref(h)
    out = f(h, *args[1:])
    h.add_(1.0)
    del h
    gc.collect()
    assert alive() is None, f
    out.sum().backward()
assert torch.equal(b.grad, torch.full_like(b, 4.0))
print("ok")
"""
    env = {**os.environ, "OPFORGE_TORCH_NATIVE": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-4000:]


def test_relu_gradient_from_its_result_matches_torch(rng):
    x = np.resize([np.nan, -1.0, 0.0, -0.0, 2.0, np.inf, -np.inf], (3, 7)) * rng.uniform(0.5, 2, (3, 7))
    a, c = torch.from_numpy(x).requires_grad_(), torch.from_numpy(x).requires_grad_()
    g = torch.from_numpy(rng.standard_normal((3, 7)))
    (got,) = torch.autograd.grad(ot.relu(a), [a], g)
    (want,) = torch.autograd.grad(torch.relu(c), [c], g)
    assert torch.equal(got, want)
