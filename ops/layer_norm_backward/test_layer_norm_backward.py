"""layer_norm_backward against the float64 formula in NumPy and torch autograd of layer_norm, on every
float dtype, SIMD target and row layout; weight and bias gradients bitwise the same whatever the
thread count; gradients through the torch and JAX adapters with and without bias."""

import numpy as np
import pytest
import torch

import opforge
import opforge.torch
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, assert_close_scaled, assert_result, cases, has_dtype,
                             random, strided, to_float64, to_framework)

# Odd row lengths leave SIMD tails; many rows make the kernel split the sums over rows into chunks.
SHAPES = [(1,), (7,), (1, 1), (3, 33), (2, 4097), (2, 3, 7), (33, 1), (4097, 33), (0, 5), (4, 0)]


def numpy_grads(g, x, w, eps):
    """(grad_x, grad_weight, grad_bias) from the formula in float64, and the magnitudes their sums ran over."""
    n = x.shape[-1]
    if n == 0:
        return (np.empty_like(x), np.empty_like(w), np.empty_like(w)) * 2
    with np.errstate(invalid="ignore"):  # rows holding NaN
        d = x - x.mean(axis=-1, keepdims=True)
        rstd = 1 / np.sqrt((d * d).mean(axis=-1, keepdims=True) + eps)
        xhat, gw = d * rstd, g * w
        mean = lambda a: a.mean(axis=-1, keepdims=True)  # noqa: E731
        rows = lambda a: a.reshape(-1, n).sum(axis=0)  # noqa: E731
        grads = (rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), rows(g * xhat), rows(g))
        scales = (rstd * (np.abs(gw) + mean(np.abs(gw)) + np.abs(xhat) * mean(np.abs(gw * xhat))),
                  rows(np.abs(g * xhat)), rows(np.abs(g)))
    return grads + scales


def torch_grads(g, x, w, eps):
    """Gradients of torch's layer_norm (with a bias) by autograd, in float64."""
    xt, wt = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    bt = torch.zeros_like(wt, requires_grad=True)
    torch.nn.functional.layer_norm(xt, x.shape[-1:], wt, bt, eps).backward(torch.from_numpy(g))
    return xt.grad.numpy(), wt.grad.numpy(), bt.grad.numpy()


def check(grad, x, w, framework, dtype, eps=None):
    g64, x64, w64 = to_float64(grad), to_float64(x), to_float64(w)
    with np.errstate(invalid="ignore"):
        x64 = x64 - x64[..., :1]  # exact for a large mean; the gradients do not change
    e = 1e-5 if eps is None else eps
    got = opforge.layer_norm_backward(grad, x, w) if eps is None else opforge.layer_norm_backward(grad, x, w, e)
    *want, sx, sw, sb = numpy_grads(g64, x64, w64, e)
    if x64.size and np.isfinite(x64).all():  # the two references agree
        for mine, theirs, scale in zip(want, torch_grads(g64, x64, w64, e), (sx, sw, sb)):
            assert_close_scaled(mine, theirs, scale, "float64")
    for result, shape in zip(got, (x64.shape, w64.shape, w64.shape)):
        assert_result(result, framework, dtype, shape)
    for result, expected, scale in zip(got, want, (sx, sw, sb)):
        assert_close_scaled(result, expected, scale, dtype)


def arrays(rng, shape, framework, dtype):
    return [to_framework(random(rng, s, dtype), framework, dtype) for s in (shape, shape, shape[-1:])]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_shapes(simd_target, rng, framework, dtype, shape):
    check(*arrays(rng, shape, framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["jax"], FLOAT_DTYPES))
def test_jax(simd_target, rng, framework, dtype):
    check(*arrays(rng, (3, 33), framework, dtype), framework, dtype)


@pytest.mark.parametrize("eps", [0.0, 1e-2, 1.0, 3], ids=str)  # an int is a valid float
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_eps(simd_target, rng, dtype, eps):
    check(*arrays(rng, (4, 33), "numpy", dtype), "numpy", dtype, eps=eps)


@pytest.mark.parametrize("dtype, mean", [("float32", 1e4), ("float64", 1e12), ("bfloat16", 100.0)])
def test_large_mean(simd_target, rng, dtype, mean):
    grad, _, w = arrays(rng, (5, 257), "torch", dtype)
    check(grad, to_framework(mean + rng.standard_normal((5, 257)), "torch", dtype), w, "torch", dtype)


STRIDED = [(f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in FLOAT_DTYPES if has_dtype(f, d)]


@pytest.mark.parametrize("framework, kind, dtype", STRIDED)
def test_strided(simd_target, rng, framework, kind, dtype):
    # Strided x, strided grad, both (with different strides), and a strided weight.
    grad, x, w = arrays(rng, (6, 40), framework, dtype)
    x_view, _ = strided(rng, (6, 40), framework, dtype, kind)
    grad_view, _ = strided(rng, (6, 40), framework, dtype, kind)
    check(grad, x_view, w, framework, dtype)
    check(grad_view, x, w, framework, dtype)
    check(grad_view, strided(rng, (6, 40), framework, dtype, "step")[0], w, framework, dtype)
    if kind != "transposed":
        check(grad, x, strided(rng, (40,), framework, dtype, kind)[0], framework, dtype)


@pytest.fixture
def restore_threads():
    before = opforge.num_threads()
    yield
    opforge.set_num_threads(before)


# (520, 4097) float32: grad_x is over 8 MiB, written with non-temporal stores from unaligned rows.
@pytest.mark.parametrize("shape", [(520, 4097), (4097, 33), (2, 3, 1000, 7)], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_deterministic_across_thread_counts(rng, restore_threads, dtype, shape):
    # Row chunks are fixed by the shape: one thread and two add the same partials in the
    # same order, bit for bit (on any SIMD target: the chunking is the kernel's outer loop).
    grad, x, w = arrays(rng, shape, "torch", dtype)
    results = []
    for threads in (1, 2, 1, 2):
        opforge.set_num_threads(threads)
        results.append(opforge.layer_norm_backward(grad, x, w))
    for r in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(r, results[0]))
    check(grad, x, w, "torch", dtype)


def test_large_on_every_target(simd_target, rng):
    check(*arrays(rng, (520, 4097), "torch", "float32"), "torch", "float32")


@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_nan_poisons_its_row(simd_target, rng, framework, dtype):
    # A NaN in x makes its row of grad_x NaN and, through the sum over rows, all of grad_weight;
    # grad_bias does not depend on x.
    x64 = rng.standard_normal((4, 37))
    x64[1, 3] = np.nan
    grad, _, w = arrays(rng, (4, 37), framework, dtype)
    gx, gw, gb = (to_float64(r) for r in opforge.layer_norm_backward(grad, to_framework(x64, framework, dtype), w))
    assert np.isnan(gx[1]).all() and np.isfinite(gx[[0, 2, 3]]).all()
    assert np.isnan(gw).all() and np.isfinite(gb).all()


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_torch_autograd(rng, bias):
    # Without a bias the adapter must hand torch None for it, not the computed grad_bias.
    x, w, b = [torch.from_numpy(rng.standard_normal(s)).requires_grad_() for s in [(3, 2, 9), (9,), (9,)]]
    args = (x, w, b) if bias else (x, w)
    assert torch.autograd.gradcheck(lambda *a: opforge.torch.layer_norm(*a, eps=1e-3), args)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_jax_grad(rng, bias):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import opforge.jax as oj
    from jax.test_util import check_grads

    x, w, b = [jnp.asarray(rng.standard_normal(s)) for s in [(3, 9), (9,), (9,)]]
    args = (x, w, b) if bias else (x, w)
    check_grads(lambda *a: oj.layer_norm(*a), args, order=1, modes=["rev"])
    jax.jit(jax.grad(lambda *a: jnp.sum(oj.layer_norm(*a) ** 2), argnums=tuple(range(len(args)))))(*args)


def test_declaration():
    assert opforge._core.op("layer_norm_backward").num_results == 3


X = np.ones((2, 3), np.float32)
W = np.ones(3, np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.layer_norm_backward(np.ones((2, 4), np.float32), X, W), ValueError,
     r"layer_norm_backward\(\): 'grad' must have shape \[2, 3\], got \[2, 4\]"),
    (lambda: opforge.layer_norm_backward(X, X, np.ones(4, np.float32)), ValueError,
     r"layer_norm_backward\(\): 'weight' must have shape \[3\], got \[4\]"),
    (lambda: opforge.layer_norm_backward(X, X, W.reshape(1, 3)), ValueError,
     r"layer_norm_backward\(\): 'weight' must have rank 1, got rank 2 \(shape \[1, 3\]\)"),
    (lambda: opforge.layer_norm_backward(X[0, 0], X[0, 0], W), ValueError,
     r"layer_norm_backward\(\): 'x' must have rank >= 1, got rank 0 \(shape \[\]\)"),
    (lambda: opforge.layer_norm_backward(X, X.astype(np.float64), W), TypeError,
     r"layer_norm_backward\(\): 'x' must have dtype float32 like 'grad', got float64"),
    (lambda: opforge.layer_norm_backward(X.astype(np.int32), X.astype(np.int32), W.astype(np.int32)), TypeError,
     r"layer_norm_backward\(\): 'grad' must have dtype in \[float32, float64, float16, bfloat16\], got int32"),
    (lambda: opforge.layer_norm_backward(X, X, W, eps=-1.0), ValueError,
     r"layer_norm_backward\(\): 'eps' must be >= 0, got -1"),
    (lambda: opforge.layer_norm_backward(X, X), TypeError,
     r"layer_norm_backward\(\) missing required argument 'weight'"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
