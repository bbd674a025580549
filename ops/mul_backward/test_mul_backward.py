"""mul_backward against float64 NumPy sums and torch autograd of mul, on every float dtype, SIMD
target, broadcast and layout; bitwise the same whatever the thread count."""

import numpy as np
import pytest
import torch

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, TOLERANCES, assert_result, cases, random, strided,
                             to_float64, to_framework)
from opforge.references import mul as mul_reference

# Relative precision the sums are accumulated in: float32 for the half types.
COMPUTE_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-24, "bfloat16": 2.0**-24}

SAME_SHAPES = [(), (1,), (7,), (4097,), (0,), (2, 7, 33)]

# (x shape, y shape): scalar-shaped on either side, rank extension, size-1 dims on both sides
# (the other operand then repeats along a summed or a kept row), empty grads with non-empty
# operands, and sizes that split the sums into chunks with chunk and tile edges inside rows.
BROADCASTS = [
    ((), (33,)),
    ((7, 33), ()),
    ((2, 33), (33,)),
    ((4, 1), (1, 7)),
    ((3, 1, 5), (4, 5)),
    ((5, 1, 33), (1, 3, 1)),
    ((4097, 1), (1, 7)),
    ((0, 3), (1, 3)),
    ((256, 1024), (1024,)),
    ((3, 1), (3, 50001)),
    ((1, 5, 1), (7, 5, 9000)),
]


def reduce_to(g, shape):
    """g summed down to `shape` the way broadcasting expanded it, in float64."""
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1)
    return g.sum(axis=axes).reshape(shape)


def torch_grads(g64, x64, y64):
    """Gradients of mul's torch reference by autograd, in float64."""
    x = torch.from_numpy(x64).requires_grad_()
    y = torch.from_numpy(y64).requires_grad_()
    mul_reference.torch(x, y).backward(torch.from_numpy(g64))
    return x.grad.numpy(), y.grad.numpy()


def assert_sum_close(got, want, abs_sum, dtype):
    """Within dtype's tolerance, plus the rounding a sum accumulates: a few ulps of sum(|terms|)."""
    rtol, atol = TOLERANCES[dtype]
    allowed = atol + 8 * COMPUTE_EPS[dtype] * abs_sum + rtol * np.abs(want)
    g = to_float64(got)
    assert g.shape == want.shape
    bad = ~(np.abs(g - want) <= allowed)  # NaN is bad too
    assert not bad.any(), f"{bad.sum()} of {bad.size} off: got {g[bad][:5]}, want {want[bad][:5]}"


def check(grad, x, y, framework, dtype):
    g64, x64, y64 = to_float64(grad), to_float64(x), to_float64(y)
    got_x, got_y = opforge.mul_backward(grad, x, y)
    want_x, want_y = reduce_to(g64 * y64, x64.shape), reduce_to(g64 * x64, y64.shape)
    auto_x, auto_y = torch_grads(g64, x64, y64)
    np.testing.assert_allclose(want_x, auto_x, rtol=1e-12, atol=1e-12)  # the two references agree
    np.testing.assert_allclose(want_y, auto_y, rtol=1e-12, atol=1e-12)
    for got, want, terms, shape in [(got_x, want_x, g64 * y64, x64.shape), (got_y, want_y, g64 * x64, y64.shape)]:
        assert_result(got, framework, dtype, shape)
        assert_sum_close(got, want, reduce_to(np.abs(terms), shape), dtype)


def arrays(rng, x_shape, y_shape, framework, dtype):
    out_shape = np.broadcast_shapes(x_shape, y_shape)
    return [to_framework(random(rng, s, dtype), framework, dtype) for s in (out_shape, x_shape, y_shape)]


@pytest.mark.parametrize("shape", SAME_SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_same_shapes(simd_target, rng, framework, dtype, shape):
    check(*arrays(rng, shape, shape, framework, dtype), framework, dtype)


@pytest.mark.parametrize("x_shape, y_shape", BROADCASTS, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["torch"], FLOAT_DTYPES))
def test_broadcast(simd_target, rng, framework, dtype, x_shape, y_shape):
    check(*arrays(rng, x_shape, y_shape, framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["jax"], FLOAT_DTYPES))
def test_jax(rng, framework, dtype):
    check(*arrays(rng, (7, 1), (33,), framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, kind", [(f, k) for f in ("numpy", "torch") for k in STRIDED_KINDS[f]])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("x_shape, y_shape", [((5, 33), (5, 33)), ((5, 33), (33,)), ((5, 1), (5, 33)),
                                              ((2, 5, 33), (5, 1))], ids=str)
def test_strided(simd_target, rng, framework, kind, dtype, x_shape, y_shape):
    # grad, then x, then y strided: the product's operands take the SIMD paths (strides 1 and 0)
    # and the scalar one, along kept and summed rows.
    grad, x, y = arrays(rng, x_shape, y_shape, framework, dtype)
    out_shape = np.broadcast_shapes(x_shape, y_shape)
    check(strided(rng, out_shape, framework, dtype, kind)[0], x, y, framework, dtype)
    check(grad, strided(rng, x_shape, framework, dtype, kind)[0], y, framework, dtype)
    check(grad, x, strided(rng, y_shape, framework, dtype, kind)[0], framework, dtype)


@pytest.fixture
def restore_threads():
    before = opforge.num_threads()
    yield
    opforge.set_num_threads(before)


@pytest.mark.parametrize("x_shape, y_shape", [((1024, 1024), (1024, 1024)), ((1024, 1024), (1024,)),
                                              ((1024, 1), (1024, 1024)), ((1, 512, 1), (8, 512, 256))], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_deterministic_across_thread_counts(simd_target, rng, restore_threads, dtype, x_shape, y_shape):
    # The split into chunks depends on the shapes only: one thread and two add the same
    # partial sums in the same order, bit for bit.
    grad, x, y = arrays(rng, x_shape, y_shape, "torch", dtype)
    results = []
    for threads in (1, 2, 1):
        opforge.set_num_threads(threads)
        results.append(opforge.mul_backward(grad, x, y))
    for gx, gy in results[1:]:
        assert torch.equal(gx, results[0][0]) and torch.equal(gy, results[0][1])
    check(grad, x, y, "torch", dtype)


@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_nan_inf(simd_target, framework, dtype):
    g64 = np.resize([np.nan, np.inf, -np.inf, 1.5, -0.0, 2.0], (3, 37))
    g64[2] = 1.0  # one row without specials: its column sums stay finite
    x64 = np.resize([1.0, -2.0, 0.5], (3, 1))
    y64 = np.resize([0.25, -1.0, 3.0, 0.0], 37)
    args = [to_framework(a, framework, dtype) for a in (g64, x64, y64)]
    got_x, got_y = opforge.mul_backward(*args)
    with np.errstate(invalid="ignore"):  # inf - inf, inf * 0
        want_x, want_y = reduce_to(g64 * y64, (3, 1)), reduce_to(g64 * x64, (37,))
    rtol, atol = TOLERANCES[dtype]
    np.testing.assert_allclose(to_float64(got_x), want_x, rtol=rtol, atol=atol, equal_nan=True)
    np.testing.assert_allclose(to_float64(got_y), want_y, rtol=rtol, atol=atol, equal_nan=True)


def test_results_are_fresh(rng):
    grad, x, y = (rng.standard_normal((4, 5)) for _ in range(3))
    before = [a.copy() for a in (grad, x, y)]
    gx, gy = opforge.mul_backward(grad, x, y)
    gx[:] = 0
    gy[:] = 0
    for a, b in zip((grad, x, y), before):
        np.testing.assert_array_equal(a, b)


def test_declared_as_mul_gradient():
    assert opforge._core.op("mul").backward == ("mul_backward", ["x", "y"])
    assert opforge._core.op("mul_backward").num_results == 2


F32 = np.ones((2, 3), np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.mul_backward(np.ones((2, 4), np.float32), np.ones((2, 1), np.float32), F32[0]), ValueError,
     r"mul_backward\(\): 'grad' must have shape \[2, 3\] \('x' of shape \[2, 1\] broadcast with 'y' of shape "
     r"\[3\]\), got \[2, 4\]"),
    (lambda: opforge.mul_backward(F32, F32, np.ones(4, np.float32)), ValueError,
     r"mul_backward\(\): 'x' of shape \[2, 3\] and 'y' of shape \[4\] cannot be broadcast together"),
    (lambda: opforge.mul_backward(F32.astype(np.int32), F32, F32), TypeError,
     r"mul_backward\(\): 'grad' must have dtype in \[float32, float64, float16, bfloat16\], got int32"),
    (lambda: opforge.mul_backward(F32, F32.astype(np.float64), F32), TypeError,
     r"mul_backward\(\): 'x' must have dtype float32 like 'grad', got float64"),
    (lambda: opforge.mul_backward(F32, F32), TypeError, r"mul_backward\(\) missing required argument 'y'"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
