"""add_backward against float64 NumPy sums and torch autograd of add, on every float dtype, SIMD
target, broadcast and layout; bitwise the same whatever the thread count."""

import numpy as np
import pytest
import torch

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, TOLERANCES, assert_result, cases, random, strided,
                             to_float64, to_framework)
from opforge.references import add as add_reference

# Relative precision the sums are accumulated in: float32 for the half types.
COMPUTE_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-24, "bfloat16": 2.0**-24}

SAME_SHAPES = [(), (1,), (7,), (33,), (4097,), (0,), (3, 0), (2, 7, 33)]

# (x shape, y shape): scalar-shaped on either side, rank extension, size-1 dims on both sides,
# empty grads with non-empty operands, and sizes that make the kernel split the sums into
# chunks (column sums, row sums, whole sums) with chunk and tile edges inside rows.
BROADCASTS = [
    ((), (33,)),
    ((7, 33), ()),
    ((1,), (4097,)),
    ((2, 33), (33,)),
    ((4, 1), (1, 7)),
    ((3, 1, 5), (4, 5)),
    ((5, 1, 33), (1, 3, 1)),
    ((1, 1), (33, 1)),
    ((4097, 1), (1, 7)),
    ((0, 3), (1, 3)),
    ((1, 3), (0, 1)),
    ((256, 1024), (1024,)),
    ((3, 1), (3, 50001)),
    ((), (300, 301)),
    ((1, 5, 1), (7, 5, 9000)),
    ((3, 1, 700), (3, 40, 700)),
]


def reduce_to(g, shape):
    """g summed down to `shape` the way broadcasting expanded it, in float64."""
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1)
    return g.sum(axis=axes).reshape(shape)


def torch_grads(g64, x64, y64):
    """Gradients of add's torch reference by autograd, in float64."""
    x = torch.from_numpy(x64).requires_grad_()
    y = torch.from_numpy(y64).requires_grad_()
    add_reference.torch(x, y).backward(torch.from_numpy(g64))
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
    g64 = to_float64(grad)
    x64, y64 = to_float64(x), to_float64(y)
    got_x, got_y = opforge.add_backward(grad, x, y)
    want_x, want_y = reduce_to(g64, x64.shape), reduce_to(g64, y64.shape)
    auto_x, auto_y = torch_grads(g64, x64, y64)
    np.testing.assert_allclose(want_x, auto_x, rtol=1e-12, atol=1e-12)  # the two references agree
    np.testing.assert_allclose(want_y, auto_y, rtol=1e-12, atol=1e-12)
    for got, want, shape in [(got_x, want_x, x64.shape), (got_y, want_y, y64.shape)]:
        assert_result(got, framework, dtype, shape)
        assert_sum_close(got, want, reduce_to(np.abs(g64), shape), dtype)


def arrays(rng, x_shape, y_shape, framework, dtype):
    out_shape = np.broadcast_shapes(x_shape, y_shape)
    return [to_framework(random(rng, s, dtype), framework, dtype) for s in (out_shape, x_shape, y_shape)]


@pytest.mark.parametrize("shape", SAME_SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_same_shapes(simd_target, rng, framework, dtype, shape):
    check(*arrays(rng, shape, shape, framework, dtype), framework, dtype)


@pytest.mark.parametrize("x_shape, y_shape", BROADCASTS, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_broadcast(simd_target, rng, framework, dtype, x_shape, y_shape):
    check(*arrays(rng, x_shape, y_shape, framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["jax"], FLOAT_DTYPES))
def test_jax(simd_target, rng, framework, dtype):
    check(*arrays(rng, (7, 1), (33,), framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, kind", [(f, k) for f in ("numpy", "torch") for k in STRIDED_KINDS[f]])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("x_shape, y_shape", [((5, 33), (33,)), ((5, 1), (5, 33)), ((2, 5, 33), (5, 1))], ids=str)
def test_strided_grad(simd_target, rng, framework, kind, dtype, x_shape, y_shape):
    # Strided grads reach every path: kept inner rows, summed inner rows, stride-0 rows.
    _, x, y = arrays(rng, x_shape, y_shape, framework, dtype)
    grad, _ = strided(rng, np.broadcast_shapes(x_shape, y_shape), framework, dtype, kind)
    check(grad, x, y, framework, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_strided_operands_only_give_shapes(simd_target, rng, dtype):
    grad, x, y = arrays(rng, (6, 40), (40,), "torch", dtype)
    x_view, _ = strided(rng, (6, 40), "torch", dtype, "transposed")
    y_view, _ = strided(rng, (40,), "torch", dtype, "step")
    check(grad, x_view, y_view, "torch", dtype)


@pytest.fixture
def restore_threads():
    before = opforge.num_threads()
    yield
    opforge.set_num_threads(before)


@pytest.mark.parametrize("x_shape, y_shape", [((1024, 1024), (1024,)), ((), (1 << 20,)), ((1024, 1), (1024, 1024)),
                                              ((1, 512, 1), (8, 512, 256))], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_deterministic_across_thread_counts(simd_target, rng, restore_threads, dtype, x_shape, y_shape):
    # The split into chunks depends on the shapes only: one thread and two add the same
    # partial sums in the same order, bit for bit.
    grad, x, y = arrays(rng, x_shape, y_shape, "torch", dtype)
    results = []
    for threads in (1, 2, 1, 2):
        opforge.set_num_threads(threads)
        results.append(opforge.add_backward(grad, x, y))
    for gx, gy in results[1:]:
        assert torch.equal(gx, results[0][0]) and torch.equal(gy, results[0][1])
    check(grad, x, y, "torch", dtype)


@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_nan_inf(simd_target, framework, dtype):
    g64 = np.resize([np.nan, np.inf, -np.inf, 1.5, -0.0, 2.0], (3, 37))
    g64[2] = 1.0  # one row without specials: its column sums stay finite
    x = to_framework(np.zeros((3, 1)), framework, dtype)
    y = to_framework(np.zeros(37), framework, dtype)
    got_x, got_y = opforge.add_backward(to_framework(g64, framework, dtype), x, y)
    with np.errstate(invalid="ignore"):  # inf + -inf
        want_x, want_y = reduce_to(g64, (3, 1)), reduce_to(g64, (37,))
    rtol, atol = TOLERANCES[dtype]
    np.testing.assert_allclose(to_float64(got_x), want_x, rtol=rtol, atol=atol, equal_nan=True)
    np.testing.assert_allclose(to_float64(got_y), want_y, rtol=rtol, atol=atol, equal_nan=True)


def test_results_are_fresh(rng):
    # With nothing summed the gradient equals grad, yet owns its memory.
    grad = rng.standard_normal((4, 5))
    before = grad.copy()
    gx, gy = opforge.add_backward(grad, grad, grad)
    gx[:] = 0
    np.testing.assert_array_equal(gy, before)
    np.testing.assert_array_equal(grad, before)


def test_declared_as_add_gradient():
    assert opforge._core.op("add").backward == ("add_backward", ["x", "y"])
    assert opforge._core.op("add_backward").num_results == 2


F32 = np.ones((2, 3), np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.add_backward(np.ones((2, 4), np.float32), np.ones((2, 1), np.float32), F32[0]), ValueError,
     r"add_backward\(\): 'grad' must have shape \[2, 3\] \('x' of shape \[2, 1\] broadcast with 'y' of shape "
     r"\[3\]\), got \[2, 4\]"),
    (lambda: opforge.add_backward(F32[0], F32, F32), ValueError,
     r"add_backward\(\): 'grad' must have shape \[2, 3\] .*, got \[3\]"),
    (lambda: opforge.add_backward(F32, F32, np.ones(4, np.float32)), ValueError,
     r"add_backward\(\): 'x' of shape \[2, 3\] and 'y' of shape \[4\] cannot be broadcast together"),
    (lambda: opforge.add_backward(F32.astype(np.int32), F32, F32), TypeError,
     r"add_backward\(\): 'grad' must have dtype in \[float32, float64, float16, bfloat16\], got int32"),
    (lambda: opforge.add_backward(F32, F32), TypeError, r"add_backward\(\) missing required argument 'y'"),
    (lambda: opforge.add_backward([1.0], F32, F32), TypeError, r"add_backward\(\): 'grad' must be an array .*got list"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
