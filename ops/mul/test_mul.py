"""mul against NumPy float64 on every dtype, SIMD target, layout and broadcast it accepts."""

import numpy as np
import pytest

import opforge
from opforge.testing import (FLOAT_DTYPES, INT_DTYPES, STRIDED_KINDS, assert_close, assert_result, cases, random,
                             strided, to_float64, to_framework)

DTYPES = FLOAT_DTYPES + INT_DTYPES

# Odd lengths leave SIMD tails on every vector width; 0-size dims must not reach the kernel.
SHAPES = [(), (1,), (7,), (4097,), (3, 0), (2, 7, 33)]

# NumPy broadcasting: scalar-shaped on either side, rank extension, and both sides at once.
BROADCASTS = [
    ((), (33,)),
    ((2, 33), (33,)),
    ((4, 1), (1, 7)),
    ((3, 1, 5), (4, 5)),
    ((5, 1, 33), (1, 3, 1)),
    ((0, 3), (1, 3)),
]


def operand(rng, shape, framework, dtype):
    # Integers small enough that products stay exact in int32.
    data = rng.integers(-(1 << 15), 1 << 15, size=shape).astype(np.float64) if dtype in INT_DTYPES else \
        random(rng, shape, dtype)
    return to_framework(data, framework, dtype)


def check(rng, framework, dtype, x_shape, y_shape):
    x, y = operand(rng, x_shape, framework, dtype), operand(rng, y_shape, framework, dtype)
    want = to_float64(x) * to_float64(y)
    got = opforge.mul(x, y)
    assert_result(got, framework, dtype, want.shape)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], DTYPES))
def test_shapes(simd_target, rng, framework, dtype, shape):
    check(rng, framework, dtype, shape, shape)


@pytest.mark.parametrize("x_shape, y_shape", BROADCASTS, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], ["float32", "bfloat16", "int64"]))
def test_broadcast(simd_target, rng, framework, dtype, x_shape, y_shape):
    check(rng, framework, dtype, x_shape, y_shape)
    check(rng, framework, dtype, y_shape, x_shape)


@pytest.mark.parametrize("framework, dtype", cases(["jax"], DTYPES))
def test_jax(rng, framework, dtype):
    check(rng, framework, dtype, (7, 33), (33,))


@pytest.mark.parametrize("framework, kind", [(f, k) for f in ("numpy", "torch") for k in STRIDED_KINDS[f]])
# int64: strided() draws integers up to 2^20, whose products need more than 32 bits.
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int64"])
def test_strided(simd_target, rng, framework, kind, dtype):
    shape = (5, 33)
    x, x64 = strided(rng, shape, framework, dtype, kind)
    y = operand(rng, shape, framework, dtype)
    y64 = to_float64(y)
    for a, b, want in [(x, y, x64 * y64), (y, x, y64 * x64), (x, x, x64 * x64)]:
        got = opforge.mul(a, b)
        assert_result(got, framework, dtype, shape)
        assert_close(got, want, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], ["float32", "bfloat16", "int32"]))
def test_large(simd_target, rng, framework, dtype):
    # 1<<20 elements: enough chunks for every worker of the thread pool.
    check(rng, framework, dtype, (1 << 10, 1 << 10), (1 << 10,))


@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_nan_inf(simd_target, framework, dtype):
    special = np.array([np.nan, np.inf, -np.inf, 1.5, -0.0])
    # Every pair, laid out 37 long so specials hit both the SIMD body and the scalar tail.
    x64 = np.resize(np.repeat(special, 5), 37)
    y64 = np.resize(np.tile(special, 5), 37)
    got = opforge.mul(to_framework(x64, framework, dtype), to_framework(y64, framework, dtype))
    with np.errstate(invalid="ignore"):  # inf * 0
        want = x64 * y64
    assert_close(got, want, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_rounds_once(simd_target, rng, dtype):
    # The product is taken in float32 and rounded once, as torch does: bit for bit the same.
    torch = pytest.importorskip("torch")

    x = to_framework(random(rng, 4099, dtype), "torch", dtype)
    y = to_framework(random(rng, 4099, dtype), "torch", dtype)
    assert torch.equal(opforge.mul(x, y), x * y)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_wraps(simd_target, dtype):
    # Integer overflow wraps like NumPy's and torch's (two's complement), in SIMD body and tail.
    info = np.iinfo(dtype)
    x = np.full(37, info.max, dtype=dtype)
    y = np.full(37, 3, dtype=dtype)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(opforge.mul(x, y), x * y)


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.mul(np.ones(3, np.float32), np.ones(3, np.float64)), TypeError,
     r"mul\(\): 'y' must have dtype float32 like 'x', got float64"),
    (lambda: opforge.mul(np.ones((2, 3)), np.ones(4)), ValueError,
     r"mul\(\): 'x' of shape \[2, 3\] and 'y' of shape \[4\] cannot be broadcast together"),
    (lambda: opforge.mul(np.ones(3, np.int8), np.ones(3, np.int8)), TypeError,
     r"mul\(\): 'x' must have dtype in \[float32, float64, float16, bfloat16, int32, int64\], got int8"),
    (lambda: opforge.mul(np.ones(3)), TypeError, r"mul\(\) missing required argument 'y'"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
