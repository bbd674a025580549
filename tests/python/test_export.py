"""Ahead-of-time export of programs that call opforge ops: torch.export (ExportedProgram, saved
and loaded in another process, a dynamic batch size) and jax.export (serialized, called in
another process; symbolic shapes refused with a clear error). The loading process imports the
frontend (opforge.torch, opforge.jax), which registers the ops and the FFI handler."""

import subprocess
import sys

import numpy as np
import pytest
import torch

import opforge.torch as ot


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 8, dtype=torch.float64))
        self.b = torch.nn.Parameter(torch.randn(16, dtype=torch.float64))
        self.g = torch.nn.Parameter(torch.rand(16, dtype=torch.float64) + 0.5)

    def forward(self, x):
        h = ot.linear_act(x, self.w, self.b, act="gelu")
        return ot.softmax(ot.add(ot.rms_norm(h, self.g), h))


def reference(block, x):
    h = torch.nn.functional.gelu(torch.nn.functional.linear(x, block.w, block.b))
    normed = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + 1e-6) * block.g
    return torch.softmax(normed + h, -1)


def run_child(code):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_torch_export_save_and_load_in_another_process(tmp_path, rng):
    torch.manual_seed(0)
    block = Block()
    x = torch.from_numpy(rng.standard_normal((4, 8)))
    batch = torch.export.Dim("batch")
    exported = torch.export.export(block, (x,), dynamic_shapes={"x": {0: batch}})
    calls = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert torch.ops.opforge.linear_act.default in calls and torch.ops.opforge.rms_norm.default in calls
    with torch.no_grad():
        for rows in (4, 9):  # one program, any batch size
            y = torch.from_numpy(rng.standard_normal((rows, 8)))
            torch.testing.assert_close(exported.module()(y), reference(block, y), rtol=1e-12, atol=1e-12)
    path = tmp_path / "block.pt2"
    torch.export.save(exported, path)
    y = torch.from_numpy(rng.standard_normal((7, 8)))
    torch.save(y, tmp_path / "y.pt")
    with torch.no_grad():
        torch.save(reference(block, y), tmp_path / "want.pt")
    run_child(f"""
import torch, opforge.torch
program = torch.export.load({str(path)!r})
got = program.module()(torch.load({str(tmp_path / 'y.pt')!r}))
torch.testing.assert_close(got, torch.load({str(tmp_path / 'want.pt')!r}), rtol=1e-12, atol=1e-12)
""")


def test_torch_export_keeps_the_ops_through_decompositions(rng):
    exported = torch.export.export(Block(), (torch.from_numpy(rng.standard_normal((3, 8))),))
    decomposed = exported.run_decompositions()
    targets = {str(n.target) for n in decomposed.graph.nodes if n.op == "call_function"}
    assert {"opforge.linear_act.default", "opforge.rms_norm.default", "opforge.add.default",
            "opforge.softmax.default"} <= targets


def jax_modules():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax import export

    import opforge.jax as oj
    return jax, jnp, export, oj


def test_jax_export_serialize_and_call_in_another_process(tmp_path, rng):
    jax, jnp, export, oj = jax_modules()
    pytest.importorskip("flatbuffers", reason="JAX serializes with flatbuffers (scripts/install.sh installs it)")
    x, w = jnp.asarray(rng.standard_normal((6, 64))), jnp.asarray(rng.uniform(0.5, 1.5, 64))
    loss = lambda x, w: jnp.sum(oj.rms_norm(x, w) ** 2)  # noqa: E731
    step = jax.jit(lambda x, w: (loss(x, w), jax.grad(loss, argnums=(0, 1))(x, w)))
    # opforge's custom call has no cross-version stability guarantee, so export asks to be told
    with pytest.raises(ValueError, match="custom calls whose targets have no compatibility guarantees"):
        export.export(step)(x, w)
    exported = export.export(step, disabled_checks=[export.DisabledSafetyCheck.custom_call("opforge_call")])(x, w)
    (tmp_path / "step.bin").write_bytes(exported.serialize())
    np.save(tmp_path / "x.npy", np.asarray(x))
    np.save(tmp_path / "w.npy", np.asarray(w))
    value, (gx, gw) = step(x, w)
    np.save(tmp_path / "want.npy", np.concatenate([np.ravel(value), np.ravel(gx), np.ravel(gw)]))
    run_child(f"""
import numpy as np, jax, opforge.jax
jax.config.update("jax_enable_x64", True)
from jax import export
step = export.deserialize(bytearray(open({str(tmp_path / 'step.bin')!r}, 'rb').read()))
value, (gx, gw) = step.call(np.load({str(tmp_path / 'x.npy')!r}), np.load({str(tmp_path / 'w.npy')!r}))
got = np.concatenate([np.ravel(value), np.ravel(gx), np.ravel(gw)])
np.testing.assert_allclose(got, np.load({str(tmp_path / 'want.npy')!r}), rtol=1e-12, atol=1e-12)
""")


def test_jax_export_with_symbolic_shapes_is_refused_naming_the_op():
    jax, jnp, export, oj = jax_modules()
    (batch,) = export.symbolic_shape("batch")
    with pytest.raises(NotImplementedError, match=r"rms_norm\(\): 'x' has shape \(batch, 64\) with a symbolic "
                                                  r"dimension; opforge's shape rules need concrete sizes"):
        export.export(jax.jit(oj.rms_norm), disabled_checks=[export.DisabledSafetyCheck.custom_call("opforge_call")])(
            jax.ShapeDtypeStruct((batch, 64), jnp.float32), jax.ShapeDtypeStruct((64,), jnp.float32))
