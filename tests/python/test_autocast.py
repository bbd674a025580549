"""torch.autocast with opforge ops: each op's declared cast policy (OpDef::autocast) on the CPU and
on forge, through opforge.torch, torch.ops and torch.compile; gradients reach float32 parameters
in float32. And autocast on the forge device for torch's own ops (its AutocastPrivateUse1 kernels).
Each result is compared bit for bit with the op run on inputs cast by hand."""

import os
import subprocess
import sys

import pytest
import torch

import opforge
import opforge.torch as ot
from opforge.testing import FORGE_BESIDE_A_GPU, forge_testable

if forge_testable():
    import opforge.forge  # noqa: F401  (the forge device)
needs_forge = pytest.mark.skipif(not forge_testable(), reason=FORGE_BESIDE_A_GPU)

POLICIES = {"linear_act": "lower_precision", "matmul_q": "lower_precision", "rms_norm": "fp32",
            "layer_norm": "fp32", "softmax": "fp32", "add": "promote", "mul": "promote", "rope": "promote",
            "scatter_add": "promote"}


def test_declared_policies():
    declared = {op["name"]: op["autocast"] for op in opforge.ops()}
    assert {n: p for n, p in declared.items() if p != "none"} == POLICIES
    assert declared["relu"] == "none" and declared["linear_act_backward"] == "none"


def randn(rng, *shape, dtype=torch.float32, device="cpu"):
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype).to(device)


def cases(rng, device):
    """(op, args, kwargs, what autocast to `low` must equal: the op on args cast by hand)."""
    x, w, b = randn(rng, 5, 8, device=device), randn(rng, 3, 8, device=device), randn(rng, 3, device=device)
    h = randn(rng, 5, 8, dtype=torch.bfloat16, device=device)  # what a lower-precision layer gave
    g = randn(rng, 8, device=device)
    cos, sin = randn(rng, 4, 4, device=device), randn(rng, 4, 4, device=device)
    xr = randn(rng, 2, 4, 3, 8, dtype=torch.bfloat16, device=device)
    yield "linear_act", (x, w, b), {"act": "gelu"}, lambda low: ot.linear_act(x.to(low), w.to(low), b.to(low),
                                                                             act="gelu")
    yield "rms_norm", (h, g), {}, lambda low: ot.rms_norm(h.float(), g)
    yield "layer_norm", (h, g, g), {}, lambda low: ot.layer_norm(h.float(), g, g)
    yield "softmax", (h,), {}, lambda low: ot.softmax(h.float())
    yield "add", (h, g), {}, lambda low: ot.add(h.float(), g)
    yield "mul", (g, h), {}, lambda low: ot.mul(g, h.float())
    yield "rope", (xr, cos, sin), {}, lambda low: ot.rope(xr.float(), cos, sin)
    yield "linear_act float64 stays", (x.double(), w.double()), {}, lambda low: ot.linear_act(x.double(), w.double())


@pytest.mark.parametrize("device", ["cpu", pytest.param("forge", marks=needs_forge)])
@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_each_policy_matches_casting_by_hand(device, low, rng):
    for label, args, kwargs, want in cases(rng, device):
        name = label.split()[0]
        expected = want(low)
        for call in (getattr(ot, name), getattr(torch.ops.opforge, name)):
            with torch.autocast(device, dtype=low):
                got = call(*args, **kwargs)
            assert got.dtype == expected.dtype, (label, call)
            assert torch.equal(got.cpu(), expected.cpu()), (label, call)
        with torch.autocast(device, dtype=low, enabled=False):  # a region with autocast off casts nothing
            if label == "linear_act":
                assert ot.linear_act(*args, **kwargs).dtype == torch.float32


@needs_forge
def test_the_other_device_type_casts_nothing(rng):
    """Autocast for forge leaves CPU tensors alone, as torch's autocast does."""
    x, w = randn(rng, 5, 8), randn(rng, 3, 8)
    with torch.autocast("forge", dtype=torch.bfloat16):
        assert ot.linear_act(x, w).dtype == torch.float32


def test_gradients_reach_float32_parameters(rng):
    x = randn(rng, 6, 8)
    w, b = randn(rng, 3, 8).requires_grad_(), randn(rng, 3).requires_grad_()
    wr, br = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = ot.linear_act(x, w, b, act="relu")
        theirs = torch.relu(torch.nn.functional.linear(x, wr, br))
    assert ours.dtype == theirs.dtype == torch.bfloat16
    ours.float().square().sum().backward()
    theirs.float().square().sum().backward()
    assert w.grad.dtype == b.grad.dtype == torch.float32
    torch.testing.assert_close(w.grad, wr.grad, rtol=2e-2, atol=2e-2)  # both products in bfloat16
    torch.testing.assert_close(b.grad, br.grad, rtol=2e-2, atol=2e-2)


def test_torch_compile_under_autocast(rng):
    x, w = randn(rng, 5, 8), randn(rng, 3, 8)
    f = torch.compile(lambda x, w: ot.rms_norm(ot.linear_act(x, w), torch.ones(3)), fullgraph=True,
                      backend="aot_eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = f(x, w)
    assert got.dtype == torch.float32  # linear_act in bfloat16, then rms_norm in float32
    assert torch.equal(got, ot.rms_norm(ot.linear_act(x.bfloat16(), w.bfloat16()).float(), torch.ones(3)))


@needs_forge
def test_forge_autocast_for_torch_ops(rng):
    """Matrix products in the lower precision, norms in float32, everything else passed through
    (creating tensors under autocast on forge failed before forge registered the pass-through)."""
    a, b = randn(rng, 4, 8, device="forge"), randn(rng, 8, 3, device="forge")
    with torch.autocast("forge", dtype=torch.bfloat16):
        z = torch.zeros(2, device="forge")
        prod = a @ b
        norm = torch.nn.functional.layer_norm(prod, (3,))
        relu = torch.relu(prod)
    assert z.dtype == torch.float32 and prod.dtype == torch.bfloat16
    assert norm.dtype == torch.float32 and relu.dtype == torch.bfloat16
    assert torch.equal(prod.cpu(), a.cpu().bfloat16() @ b.cpu().bfloat16())
    with pytest.warns(UserWarning, match="forge Autocast only supports dtypes of torch.bfloat16, torch.float16"):
        with torch.autocast("forge", dtype=torch.float64):
            pass


def test_python_adapter_casts_too():
    """OPFORGE_TORCH_NATIVE=0 (the adapter's Python half only): the same policies, in Python."""
    code = """
import torch, opforge.torch as ot
assert not ot.NATIVE_AUTOGRAD
x, w, g = torch.randn(5, 8), torch.randn(3, 8, requires_grad=True), torch.ones(3)
with torch.autocast("cpu", dtype=torch.bfloat16):
    h = ot.linear_act(x, w)
    n = ot.rms_norm(h, g)
    s = ot.add(h, g)
    d = ot.linear_act(x.double(), w.detach().double())
assert h.dtype == torch.bfloat16 and torch.equal(h, ot.linear_act(x.bfloat16(), w.bfloat16()))
assert n.dtype == torch.float32 and torch.equal(n, ot.rms_norm(h.float(), g))
assert s.dtype == torch.float32 and torch.equal(s, ot.add(h.float(), g))
assert d.dtype == torch.float64
h.float().sum().backward()
assert w.grad.dtype == torch.float32
print("ok")
"""
    env = {**os.environ, "OPFORGE_TORCH_NATIVE": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-4000:]
