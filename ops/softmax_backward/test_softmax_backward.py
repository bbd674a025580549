"""softmax_backward against the float64 formula and torch autograd of softmax, on every float dtype,
SIMD target and row layout, with broadcast leading dimensions."""

import numpy as np
import pytest
import torch

import opforge
import opforge.torch
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, TOLERANCES, assert_result, cases, has_dtype, random,
                             strided, to_float64, to_framework)

# Relative precision the kernel computes in: float32 for the half types.
COMPUTE_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-24, "bfloat16": 2.0**-24}
SHAPES = [(1,), (7,), (1, 1), (3, 33), (2, 4097), (2, 3, 7), (0, 5), (4, 0)]


def numpy_grad(g, y):
    """grad_x from the formula in float64, and the magnitude of its terms."""
    dot = np.sum(g * y, axis=-1, keepdims=True)
    scale = np.abs(y) * (np.abs(g) + np.sum(np.abs(g * y), axis=-1, keepdims=True))
    return y * (g - dot), scale


def assert_close(got, want, scale, dtype):
    """Within dtype's tolerance, plus a few ulps (of the compute type) of the terms' magnitudes:
    g - sum(g * y) cancels."""
    rtol, atol = TOLERANCES[dtype]
    allowed = atol + 16 * COMPUTE_EPS[dtype] * scale + rtol * np.abs(want)
    g = to_float64(got)
    assert g.shape == want.shape
    bad = ~(np.abs(g - want) <= allowed)
    assert not bad.any(), f"{bad.sum()} of {bad.size} off: got {g[bad][:5]}, want {want[bad][:5]}"


def softmax_of(rng, shape, framework, dtype):
    """A real softmax result (rows summing to 1) as y, in the dtype under test."""
    x = rng.standard_normal(shape)
    e = np.exp(x - x.max(axis=-1, keepdims=True)) if x.size else x
    return to_framework(e / e.sum(axis=-1, keepdims=True) if x.size else x, framework, dtype)


def check(grad, y, framework, dtype):
    g64, y64 = to_float64(grad), to_float64(y)
    want, scale = numpy_grad(g64, y64)
    got = opforge.softmax_backward(grad, y)
    assert_result(got, framework, dtype, want.shape)
    assert_close(got, want, scale, dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_shapes(simd_target, rng, framework, dtype, shape):
    grad = to_framework(random(rng, shape, dtype), framework, dtype)
    check(grad, softmax_of(rng, shape, framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["jax"], FLOAT_DTYPES))
def test_jax(simd_target, rng, framework, dtype):
    grad = to_framework(random(rng, (3, 33), dtype), framework, dtype)
    check(grad, softmax_of(rng, (3, 33), framework, dtype), framework, dtype)


@pytest.mark.parametrize("shape", [(5, 9), (2, 3, 4097)], ids=str)
def test_matches_torch_autograd(rng, shape):
    x = torch.from_numpy(rng.standard_normal(shape)).requires_grad_()
    g = torch.from_numpy(rng.standard_normal(shape))
    y = torch.softmax(x, dim=-1)
    y.backward(g)
    got = opforge.softmax_backward(g, y.detach())
    torch.testing.assert_close(got, x.grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("framework, kind, dtype", [
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in FLOAT_DTYPES if has_dtype(f, d)])
def test_strided(simd_target, rng, framework, kind, dtype):
    grad_view, _ = strided(rng, (6, 40), framework, dtype, kind)
    grad = to_framework(random(rng, (6, 40), dtype), framework, dtype)
    y = softmax_of(rng, (6, 40), framework, dtype)
    check(grad_view, y, framework, dtype)
    y_view, _ = strided(rng, (6, 40), framework, dtype, kind)  # any values will do
    check(grad, y_view, framework, dtype)
    check(grad_view, y_view, framework, dtype)


@pytest.mark.parametrize("g_shape, y_shape", [((4, 3, 9), (3, 9)), ((3, 9), (4, 3, 9)), ((4, 1, 9), (1, 3, 9)),
                                              ((5, 1), (2, 5, 1))], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_broadcast_leading_dims(simd_target, rng, dtype, g_shape, y_shape):
    # What jax.vmap of a vjp with a shared primal sends: rows are independent, so leading
    # dimensions broadcast like NumPy's.
    grad = to_framework(random(rng, g_shape, dtype), "torch", dtype)
    y = softmax_of(rng, y_shape, "torch", dtype)
    shape = np.broadcast_shapes(g_shape, y_shape)
    want, scale = numpy_grad(*np.broadcast_arrays(to_float64(grad), to_float64(y)))
    got = opforge.softmax_backward(grad, y)
    assert_result(got, "torch", dtype, shape)
    assert_close(got, want, scale, dtype)


# Outputs of 8 MiB and more (float32, float64) are written with non-temporal stores; 4097 leaves
# rows unaligned, so each starts with scalar stores. bfloat16 takes the ordinary stores.
LARGE = [pytest.param(f, d, s, id=f"{f}-{d}") for f, d, s in
         [("numpy", "float32", (520, 4097)), ("torch", "float64", (260, 4097)), ("torch", "bfloat16", (256, 4096))]]


@pytest.mark.parametrize("framework, dtype, shape", LARGE)
def test_large(simd_target, rng, framework, dtype, shape):
    grad = to_framework(random(rng, shape, dtype), framework, dtype)
    check(grad, softmax_of(rng, shape, framework, dtype), framework, dtype)


def test_is_softmax_gradient_in_torch_autograd(rng):
    x = torch.from_numpy(rng.standard_normal((4, 11))).requires_grad_()
    assert torch.autograd.gradcheck(opforge.torch.softmax, (x,))


X = np.ones((2, 3), np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.softmax_backward(X, np.ones((2, 4), np.float32)), ValueError,
     r"softmax_backward\(\): 'grad' and 'result' must have the same last dimension, got shapes \[2, 3\] and \[2, 4\]"),
    (lambda: opforge.softmax_backward(np.ones((4, 3), np.float32), np.ones((2, 3), np.float32)), ValueError,
     r"softmax_backward\(\): 'grad' of shape \[4, 3\] and 'result' of shape \[2, 3\] cannot be broadcast"),
    (lambda: opforge.softmax_backward(X, X.astype(np.float64)), TypeError,
     r"softmax_backward\(\): 'result' must have dtype float32 like 'grad', got float64"),
    (lambda: opforge.softmax_backward(X.astype(np.int64), X.astype(np.int64)), TypeError,
     r"softmax_backward\(\): 'grad' must have dtype in \[float32, float64, float16, bfloat16\], got int64"),
    (lambda: opforge.softmax_backward(np.array(1.0, np.float32), X), ValueError,
     r"softmax_backward\(\): 'grad' must have rank >= 1, got rank 0"),
    (lambda: opforge.softmax_backward(X), TypeError, r"softmax_backward\(\) missing required argument 'result'"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
