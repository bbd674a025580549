"""scatter_add_backward (a gather along dim) against NumPy's take and against finite differences of
scatter_add, on every float dtype and layout; every error path."""

import numpy as np
import pytest

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, assert_result, cases, has_dtype, random, strided,
                             to_float64, to_framework)
from opforge.testing import torch  # None without torch: its cases skip, NumPy's still run

# (grad shape, dim, len(index)): the result has grad's shape with shape[dim] = len(index).
SHAPES = [((1,), 0, 1), ((3,), 0, 7), ((5,), 0, 4097), ((4, 33), 0, 6), ((4, 33), 1, 9), ((4, 33), -1, 0),
          ((2, 3, 4097), 1, 5), ((3, 5, 7), 2, 11), ((0, 4), 1, 3)]


def check(grad, index, dim, framework, dtype):
    got = opforge.scatter_add_backward(grad, index, dim)
    want = np.take(to_float64(grad), to_float64(index).astype(np.int64), axis=dim)
    assert_result(got, framework, dtype, want.shape)
    np.testing.assert_array_equal(to_float64(got), want)  # a gather: exact


def index_for(rng, n, limit, framework):
    values = rng.integers(0, limit, n)
    return torch.from_numpy(values) if framework == "torch" else values


@pytest.mark.parametrize("shape, dim, n", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_shapes(simd_target, rng, framework, dtype, shape, dim, n):
    grad = to_framework(random(rng, shape, dtype), framework, dtype)
    check(grad, index_for(rng, n, max(shape[dim], 1), framework), dim, framework, dtype)


@pytest.mark.parametrize("framework, kind, dtype", [
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in FLOAT_DTYPES if has_dtype(f, d)])
def test_strided(rng, framework, kind, dtype):
    for dim in (0, 1, 2):
        grad, _ = strided(rng, (5, 6, 9), framework, dtype, kind)
        check(grad, index_for(rng, 8, grad.shape[dim], framework), dim, framework, dtype)
    grad = to_framework(random(rng, (5, 3), dtype), framework, dtype)
    check(grad, index_for(rng, 30, 5, framework)[::3], 0, framework, dtype)


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_is_scatter_adds_gradient(rng, index_dtype):
    # Against finite differences of scatter_add (linear: central differences are exact up to
    # rounding), with indices repeating and buckets left empty.
    src = random(rng, (4, 10, 3), "float64")
    index = rng.integers(0, 7, 10).astype(index_dtype)
    grad = random(rng, (4, 7, 3), "float64")
    got = opforge.scatter_add_backward(grad, index, 1)
    numeric = np.empty_like(src)
    for pos in np.ndindex(src.shape):
        e = np.zeros_like(src)
        e[pos] = 1e-3
        up, down = opforge.scatter_add(src + e, index, 7, 1), opforge.scatter_add(src - e, index, 7, 1)
        numeric[pos] = np.sum(grad * (up - down)) / 2e-3
    np.testing.assert_allclose(got, numeric, rtol=1e-9, atol=1e-9)


def test_declared_as_scatter_adds_gradient():
    assert opforge._core.op("scatter_add").backward == ("scatter_add_backward", ["src"])


@pytest.mark.parametrize("framework, dtype", cases(["jax"], FLOAT_DTYPES))
def test_jax(rng, framework, dtype):
    import jax.numpy as jnp

    grad = to_framework(random(rng, (6, 5), dtype), framework, dtype)
    check(grad, jnp.asarray(rng.integers(0, 6, 8), dtype=jnp.int32), 0, framework, dtype)


G = np.ones((4, 3), np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.scatter_add_backward(G, np.array([0, 4, 9])), ValueError,
     r"scatter_add_backward\(\): 'index' must hold values in \[0, grad.shape\[dim\]\) = \[0, 4\), got 4 at position 1"),
    (lambda: opforge.scatter_add_backward(G, np.array([0, 1, -2]), dim=1), ValueError,
     r"\[0, grad.shape\[dim\]\) = \[0, 3\), got -2 at position 2"),
    # No columns to gather: the index is still checked.
    (lambda: opforge.scatter_add_backward(G[:, :0], np.array([0, 4])), ValueError, r"\[0, 4\), got 4 at position 1"),
    (lambda: opforge.scatter_add_backward(G, np.array([0.0])), TypeError,
     r"scatter_add_backward\(\): 'index' must have dtype in \[int32, int64\], got float64"),
    (lambda: opforge.scatter_add_backward(G, np.zeros((1, 1), np.int64)), ValueError,
     r"scatter_add_backward\(\): 'index' must have rank 1, got rank 2"),
    (lambda: opforge.scatter_add_backward(G, np.array([0]), dim=2), ValueError,
     r"scatter_add_backward\(\): 'dim' must be in \[-2, 2\) for 'grad' of rank 2, got 2"),
    (lambda: opforge.scatter_add_backward(G.astype(np.int64), np.array([0])), TypeError,
     r"scatter_add_backward\(\): 'grad' must have dtype in \[float32, float64, float16, bfloat16\], got int64"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
