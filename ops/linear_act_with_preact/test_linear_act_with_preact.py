"""linear_act_with_preact: its first result is linear_act's, bit for bit (the same product and
epilogue, tested against float64 in test_linear_act.py), its second the pre-activation x @ w^T + b
against float64 NumPy; on every dtype, SIMD target, activation, kernel path and layout; and the
adapters run it in place of linear_act when a gradient is needed."""

import math

import numpy as np
import pytest
import torch

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, TOLERANCES, assert_result, cases, product_rounding,
                             random, strided, to_float64, to_framework, torch_ops_dispatched)

ACTS = ["none", "relu", "gelu", "gelu_tanh", "silu"]
COMPUTE_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-24, "bfloat16": 2.0**-24}
# (m, n, k) as in test_linear_act.py: dot products (a side of few rows), packed panels along
# either operand (the epilogue's row and column paths), several K and row blocks, edge tiles.
SHAPES = [(1, 7, 33), (1, 1, 1), (5, 65, 257), (65, 5, 33), (7, 65, 33), (33, 65, 513), (257, 33, 65),
          (257, 300, 33)]


def arrays(rng, m, n, k, framework, dtype, bias=True, lead=()):
    x = to_framework(random(rng, lead + (m, k), dtype), framework, dtype)
    w = to_framework(random(rng, (n, k), dtype) / math.sqrt(max(k, 1)), framework, dtype)
    b = to_framework(random(rng, (n,), dtype), framework, dtype) if bias else None
    return x, w, b


def as_numpy(a):
    return a.float().numpy() if isinstance(a, torch.Tensor) else np.asarray(a).astype(np.float64)


def check(x, w, b, framework, dtype, act):
    out, preact = opforge.linear_act_with_preact(x, w, b, act=act)
    x64, w64 = to_float64(x), to_float64(w)
    b64 = None if b is None else to_float64(b)
    want = x64 @ w64.T + (0 if b64 is None else b64)
    assert_result(out, framework, dtype, want.shape)
    assert_result(preact, framework, dtype, want.shape)
    np.testing.assert_array_equal(as_numpy(out), as_numpy(opforge.linear_act(x, w, b, act=act)))
    # A sum of k products: k ulps of the magnitude it ran over, plus the dtype's rounding.
    scale = np.abs(x64) @ np.abs(w64).T + (0 if b64 is None else np.abs(b64))
    rtol, atol = TOLERANCES[dtype]
    allowed = atol + rtol * np.abs(want) + 1.2 * (x64.shape[-1] + 2) * COMPUTE_EPS[dtype] * scale
    allowed += product_rounding(preact, x64 @ w64.T, dtype)
    got = to_float64(preact)
    bad = ~(np.abs(got - want) <= allowed)
    assert not bad.any(), f"{bad.sum()} of {bad.size} off: got {got[bad][:5]}, want {want[bad][:5]}"


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy"], FLOAT_DTYPES) + cases(["torch"], ["bfloat16"]))
def test_shapes(simd_target, rng, framework, dtype, shape):
    check(*arrays(rng, *shape, framework, dtype), framework, dtype, "gelu")


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape", [(3, 40, 65), (70, 33, 9), (33, 70, 300)], ids=str)
def test_acts(rng, act, bias, shape):
    check(*arrays(rng, *shape, "numpy", "float32", bias), "numpy", "float32", act)


@pytest.mark.parametrize("framework, dtype", cases(["torch", "jax"], FLOAT_DTYPES))
def test_frameworks(rng, framework, dtype):
    check(*arrays(rng, 9, 20, 33, framework, dtype, lead=(2,)), framework, dtype, "silu")


@pytest.mark.parametrize("framework, kind", [(f, k) for f in ("numpy", "torch") for k in STRIDED_KINDS[f]])
def test_strided(simd_target, rng, framework, kind):
    x, w, b = arrays(rng, 6, 40, 33, framework, "float32")
    check(strided(rng, (6, 33), framework, "float32", kind)[0], w, b, framework, "float32", "gelu")
    check(x, strided(rng, (40, 33), framework, "float32", kind)[0], b, framework, "float32", "gelu")
    base = to_framework(random(rng, (2, 7, 33), "float32"), framework, "float32")  # rows not evenly spaced
    check(base[:, ::4], w, b, framework, "float32", "gelu")


def test_empty(rng):
    out, preact = opforge.linear_act_with_preact(*arrays(rng, 0, 5, 3, "numpy", "float32"))
    assert out.shape == preact.shape == (0, 5)
    x, w, b = arrays(rng, 4, 5, 0, "numpy", "float64")  # k = 0: z = bias
    check(x, w, b, "numpy", "float64", "silu")


def test_declared_as_linear_act_saving_forward():
    assert opforge._core.op("linear_act").saving_forward == ("linear_act_with_preact", ["preact"])
    assert opforge._core.op("linear_act_with_preact").leading_dim_args == ["x"]


def test_torch_autograd_saves_the_preactivation(rng):
    """With a gradient needed, torch's autograd kernel runs linear_act_with_preact and hands z to
    the backward op (no product recomputed); without, plain linear_act. Gradients match torch's."""
    import opforge.torch as ot
    from opforge.references import linear_act as reference

    x, w, b = (t.requires_grad_() for t in arrays(rng, 6, 9, 5, "torch", "float64", lead=(2,)))
    plain = torch_ops_dispatched(lambda: ot.linear_act(x.detach(), w.detach(), b.detach(), act="gelu"))
    assert plain == ["linear_act"]
    seen = torch_ops_dispatched(lambda: ot.linear_act(x, w, b, act="gelu").sin().sum().backward())
    assert seen == ["linear_act_with_preact", "linear_act_backward"], seen
    ours = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    reference.torch(x, w, b, "gelu").sin().sum().backward()
    for g, t in zip(ours, (x, w, b)):
        torch.testing.assert_close(g, t.grad, rtol=1e-12, atol=1e-12)


def test_jax_grad_saves_the_preactivation(rng):
    import jax
    import jax.numpy as jnp

    import opforge.jax as oj

    x, w, b = arrays(rng, 3, 6, 5, "jax", "float64", lead=(2,))
    loss = lambda x, w, b: jnp.sum(jnp.sin(oj.linear_act(x, w, b, act="gelu")))  # noqa: E731
    plain = str(jax.make_jaxpr(loss)(x, w, b))
    differentiated = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(x, w, b))
    called = lambda op, jaxpr: jaxpr.count(f"('op', '{op}')")  # noqa: E731  (the FFI call's attribute)
    assert called("linear_act", plain) == 1 and called("linear_act_with_preact", plain) == 0
    assert called("linear_act", differentiated) == 0 and called("linear_act_with_preact", differentiated) == 1
    assert called("linear_act_backward", differentiated) == 1


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.linear_act_with_preact(np.ones((2, 3), np.float32), np.ones((4, 2), np.float32)), ValueError,
     r"linear_act_with_preact\(\): 'weight' must have shape \[n, 3\] \(k = x.shape\[-1\] = 3\), got \[4, 2\]"),
    (lambda: opforge.linear_act_with_preact(np.ones((2, 3), np.float32), np.ones((4, 3)), None), TypeError,
     r"linear_act_with_preact\(\): 'weight' must have dtype float32 like 'x', got float64"),
    (lambda: opforge.linear_act_with_preact(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), act="elu"),
     ValueError, r"linear_act_with_preact\(\): 'act' must be one of"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
