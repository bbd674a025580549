"""rope_backward against the float64 inverse rotation in NumPy, torch autograd of the HF/GPT-J
formulas, gradcheck and jax.grad, in both pairings, on every float dtype, SIMD target and layout."""

import numpy as np
import pytest
import torch

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, assert_close, assert_result, cases, has_dtype, random,
                             strided, to_float64, to_framework)
from opforge.references import rope as rope_reference

SHAPES = [(1, 1, 2), (7, 3, 14), (1, 2, 8194), (2, 3, 5, 2, 32), (0, 2, 4)]


def rotate_back(g, cos, sin, interleaved):
    """float64: pair (a, b) -> (a*c + b*s, -a*s + b*c), the transpose of rope's rotation."""
    half = g.shape[-1] // 2
    i = np.arange(half)
    ia, ib = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(g)
    out[..., ia] = g[..., ia] * c + g[..., ib] * s
    out[..., ib] = -g[..., ia] * s + g[..., ib] * c
    return out


def arrays(rng, shape, framework, dtype):
    cos, sin = rope_reference.tables(shape[-3], shape[-1])
    return [to_framework(a, framework, dtype) for a in (random(rng, shape, dtype), cos, sin)]


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_shapes(simd_target, rng, framework, dtype, shape, interleaved):
    g, cos, sin = arrays(rng, shape, framework, dtype)
    got = opforge.rope_backward(g, cos, sin, interleaved)
    want = rotate_back(to_float64(g), to_float64(cos), to_float64(sin), interleaved)
    assert_result(got, framework, dtype, want.shape)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("framework, kind, dtype", [
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in FLOAT_DTYPES if has_dtype(f, d)])
def test_strided(rng, framework, kind, dtype):
    g, cos, sin = arrays(rng, (2, 5, 3, 10), framework, dtype)
    g_view, g64 = strided(rng, (2, 5, 3, 10), framework, dtype, kind)
    for interleaved in (False, True):
        got = opforge.rope_backward(g_view, cos, sin, interleaved)
        assert_close(got, rotate_back(g64, to_float64(cos), to_float64(sin), interleaved), dtype)


@pytest.mark.parametrize("interleaved", [False, True])
def test_inverts_rope(rng, interleaved):
    # With true angles (cos^2 + sin^2 = 1) the rotation back undoes the rotation.
    x, cos, sin = arrays(rng, (3, 9, 2, 40), "numpy", "float64")
    np.testing.assert_allclose(opforge.rope_backward(opforge.rope(x, cos, sin, interleaved), cos, sin, interleaved),
                               x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("interleaved", [False, True])
def test_torch_autograd(rng, interleaved):
    import opforge.torch as ot

    x, cos, sin = arrays(rng, (2, 5, 3, 12), "torch", "float64")
    cos = cos + 0.1 * torch.randn_like(cos)  # gradcheck needs no unit circle: the op is linear in x
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda t: ot.rope(t, cos, sin, interleaved), (x,))
    ot.rope(x, cos, sin, interleaved).sin().sum().backward()
    theirs = x.detach().clone().requires_grad_()
    rope_reference.torch(theirs, cos, sin, interleaved).sin().sum().backward()
    torch.testing.assert_close(x.grad, theirs.grad, rtol=1e-12, atol=1e-12)


def test_tables_get_no_gradient(rng):
    # Declared: only x is differentiable. torch leaves the tables' .grad unset.
    import opforge.torch as ot

    x, cos, sin = arrays(rng, (2, 5, 3, 12), "torch", "float64")
    for t in (x, cos, sin):
        t.requires_grad_()
    ot.rope(x, cos, sin).sum().backward()
    assert x.grad is not None and cos.grad is None and sin.grad is None
    assert opforge._core.op("rope").backward == ("rope_backward", ["x"])


@pytest.mark.parametrize("interleaved", [False, True])
def test_jax_grad(rng, interleaved):
    import jax
    import jax.numpy as jnp

    import opforge.jax as oj

    x, cos, sin = arrays(rng, (2, 5, 3, 12), "jax", "float64")
    ours = jax.grad(lambda t: jnp.sum(jnp.sin(oj.rope(t, cos, sin, interleaved))))(x)
    theirs = jax.grad(lambda t: jnp.sum(jnp.sin(rope_reference.jax(t, cos, sin, interleaved))))(x)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-12, atol=1e-12)
    # Under vmap with shared tables, the batch rides as one more leading dim: one call.
    xs = jnp.stack([x, 2 * x])
    got = jax.vmap(lambda t: oj.rope_backward(t, cos, sin, interleaved))(xs)
    want = jnp.stack([oj.rope_backward(t, cos, sin, interleaved) for t in xs])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("framework, dtype", cases(["jax"], FLOAT_DTYPES))
def test_jax(rng, framework, dtype):
    g, cos, sin = arrays(rng, (2, 5, 3, 18), framework, dtype)
    got = opforge.rope_backward(g, cos, sin, True)
    assert_close(got, rotate_back(*map(to_float64, (g, cos, sin)), True), dtype)


G = np.ones((2, 3, 8), np.float32)
T = np.ones((2, 4), np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.rope_backward(np.ones((2, 3, 5), np.float32), T, T), ValueError,
     r"rope_backward\(\): 'grad' must have an even last dimension \(its pairs are rotated\), got shape \[2, 3, 5\]"),
    (lambda: opforge.rope_backward(G, np.ones((2, 3), np.float32), T), ValueError,
     r"rope_backward\(\): 'cos' must have shape \[2, 4\], got \[2, 3\]"),
    (lambda: opforge.rope_backward(G, T, T.astype(np.float16)), TypeError,
     r"rope_backward\(\): 'sin' must have dtype float32 like 'grad', got float16"),
    (lambda: opforge.rope_backward(G[0], T, T), ValueError, r"rope_backward\(\): 'grad' must have rank >= 3"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
