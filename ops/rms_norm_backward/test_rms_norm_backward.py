"""rms_norm_backward against the float64 formula in NumPy and torch autograd of rms_norm, on every
float dtype, SIMD target and row layout; grad_weight bitwise the same whatever the thread count."""

import numpy as np
import pytest
import torch

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, assert_close_scaled, assert_result, cases, has_dtype,
                             random, strided, to_float64, to_framework)
from opforge.references import rms_norm as rms_norm_reference

# Odd row lengths leave SIMD tails; many rows make the kernel split grad_weight's sum into chunks.
SHAPES = [(1,), (7,), (1, 1), (3, 33), (2, 4097), (2, 3, 7), (33, 1), (4097, 33), (0, 5), (4, 0)]


def numpy_grads(g, x, w, eps):
    """(grad_x, grad_weight) from the formula, in float64, and the magnitudes their sums ran over."""
    n = x.shape[-1]
    if n == 0:
        return np.empty_like(x), np.empty_like(w), np.empty_like(x), np.empty_like(w)
    with np.errstate(invalid="ignore"):  # rows holding NaN
        inv = 1 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        gw = g * w
        grad_x = inv * (gw - x * inv**2 * np.mean(gw * x, axis=-1, keepdims=True))
        grad_w = (g * x * inv).reshape(-1, n).sum(axis=0)
        scale_x = inv * np.abs(gw) + np.abs(x) * inv**3 * np.mean(np.abs(gw * x), axis=-1, keepdims=True)
        scale_w = np.abs(g * x * inv).reshape(-1, n).sum(axis=0)
    return grad_x, grad_w, scale_x, scale_w


def torch_grads(g, x, w, eps):
    """Gradients of rms_norm's torch reference by autograd, in float64."""
    xt = torch.from_numpy(x).requires_grad_()
    wt = torch.from_numpy(w).requires_grad_()
    rms_norm_reference.torch(xt, wt, eps).backward(torch.from_numpy(g))
    return xt.grad.numpy(), wt.grad.numpy()


def check(grad, x, w, framework, dtype, eps=None):
    g64, x64, w64 = to_float64(grad), to_float64(x), to_float64(w)
    e = 1e-6 if eps is None else eps
    got_x, got_w = opforge.rms_norm_backward(grad, x, w) if eps is None else opforge.rms_norm_backward(grad, x, w, eps)
    want_x, want_w, scale_x, scale_w = numpy_grads(g64, x64, w64, e)
    if x64.size and np.isfinite(x64).all():  # the two references agree
        auto_x, auto_w = torch_grads(g64, x64, w64, e)
        assert_close_scaled(want_x, auto_x, scale_x, "float64")
        assert_close_scaled(want_w, auto_w, scale_w, "float64")
        assert_close_scaled(got_x, auto_x, scale_x, dtype)
        assert_close_scaled(got_w, auto_w, scale_w, dtype)
    assert_result(got_x, framework, dtype, x64.shape)
    assert_result(got_w, framework, dtype, w64.shape)
    assert_close_scaled(got_x, want_x, scale_x, dtype)
    assert_close_scaled(got_w, want_w, scale_w, dtype)


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


STRIDED = [(f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in FLOAT_DTYPES if has_dtype(f, d)]


@pytest.mark.parametrize("framework, kind, dtype", STRIDED)
def test_strided_rows(simd_target, rng, framework, kind, dtype):
    # Strided x, strided grad, and both (with different strides): rows are gathered.
    grad, x, w = arrays(rng, (6, 40), framework, dtype)
    x_view, _ = strided(rng, (6, 40), framework, dtype, kind)
    grad_view, _ = strided(rng, (6, 40), framework, dtype, kind)
    check(grad, x_view, w, framework, dtype)
    check(grad_view, x, w, framework, dtype)
    check(grad_view, strided(rng, (6, 40), framework, dtype, "step")[0], w, framework, dtype)


@pytest.mark.parametrize("framework, kind, dtype", [s for s in STRIDED if s[1] != "transposed"])
def test_strided_weight(simd_target, rng, framework, kind, dtype):
    grad, x, _ = arrays(rng, (6, 40), framework, dtype)
    w, _ = strided(rng, (40,), framework, dtype, kind)
    check(grad, x, w, framework, dtype)


@pytest.fixture
def restore_threads():
    before = opforge.num_threads()
    yield
    opforge.set_num_threads(before)


# (520, 4097) float32: grad_x is over 8 MiB, written with non-temporal stores from unaligned rows
# (each row's first elements one at a time until the stores are aligned).
@pytest.mark.parametrize("shape", [(256, 4096), (520, 4097), (4097, 33), (2, 3, 1000, 7)], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_deterministic_across_thread_counts(simd_target, rng, restore_threads, dtype, shape):
    # Row chunks are fixed by the shape: one thread and two add the same partials in the
    # same order, bit for bit.
    grad, x, w = arrays(rng, shape, "torch", dtype)
    results = []
    for threads in (1, 2, 1, 2):
        opforge.set_num_threads(threads)
        results.append(opforge.rms_norm_backward(grad, x, w))
    for gx, gw in results[1:]:
        assert torch.equal(gx, results[0][0]) and torch.equal(gw, results[0][1])
    check(grad, x, w, "torch", dtype)


@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_nan_poisons_its_row(simd_target, rng, framework, dtype):
    # A NaN in x makes its row of grad_x NaN and, through the sum over rows, all of grad_weight.
    x64 = rng.standard_normal((4, 37))
    x64[1, 3] = np.nan
    grad, _, w = arrays(rng, (4, 37), framework, dtype)
    got_x, got_w = opforge.rms_norm_backward(grad, to_framework(x64, framework, dtype), w)
    gx = to_float64(got_x)
    assert np.isnan(gx[1]).all() and np.isfinite(gx[[0, 2, 3]]).all()
    assert np.isnan(to_float64(got_w)).all()
    check(grad[[0, 2, 3]], to_framework(x64[[0, 2, 3]], framework, dtype), w, framework, dtype)


def test_declared_as_rms_norm_gradient():
    assert opforge._core.op("rms_norm").backward == ("rms_norm_backward", ["x", "weight"])
    assert opforge._core.op("rms_norm_backward").num_results == 2


X = np.ones((2, 3), np.float32)
W = np.ones(3, np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.rms_norm_backward(np.ones((2, 4), np.float32), X, W), ValueError,
     r"rms_norm_backward\(\): 'grad' must have shape \[2, 3\], got \[2, 4\]"),
    (lambda: opforge.rms_norm_backward(X, X, np.ones(4, np.float32)), ValueError,
     r"rms_norm_backward\(\): 'weight' must have shape \[3\], got \[4\]"),
    (lambda: opforge.rms_norm_backward(X, X, W.reshape(1, 3)), ValueError,
     r"rms_norm_backward\(\): 'weight' must have rank 1, got rank 2 \(shape \[1, 3\]\)"),
    (lambda: opforge.rms_norm_backward(X[0, 0], X[0, 0], W), ValueError,
     r"rms_norm_backward\(\): 'x' must have rank >= 1, got rank 0 \(shape \[\]\)"),
    (lambda: opforge.rms_norm_backward(X, X.astype(np.float64), W), TypeError,
     r"rms_norm_backward\(\): 'x' must have dtype float32 like 'grad', got float64"),
    (lambda: opforge.rms_norm_backward(X, X, W.astype(np.float16)), TypeError,
     r"rms_norm_backward\(\): 'weight' must have dtype float32 like 'grad', got float16"),
    (lambda: opforge.rms_norm_backward(X.astype(np.int32), X.astype(np.int32), W.astype(np.int32)), TypeError,
     r"rms_norm_backward\(\): 'grad' must have dtype in \[float32, float64, float16, bfloat16\], got int32"),
    (lambda: opforge.rms_norm_backward(X, X, W, eps=-1.0), ValueError,
     r"rms_norm_backward\(\): 'eps' must be >= 0, got -1"),
    (lambda: opforge.rms_norm_backward(X, X, W, eps="a"), TypeError,
     r"rms_norm_backward\(\): 'eps' must be a float, got str"),
    (lambda: opforge.rms_norm_backward(X, X), TypeError, r"rms_norm_backward\(\) missing required argument 'weight'"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
