"""add against NumPy float64 on every dtype, SIMD target, layout and broadcast it accepts."""

import numpy as np
import pytest

import opforge
from opforge.testing import (FLOAT_DTYPES, INT_DTYPES, STRIDED_KINDS, assert_close, assert_result, cases, random,
                             strided, to_float64, to_framework)

DTYPES = FLOAT_DTYPES + INT_DTYPES

# Odd lengths leave SIMD tails on every vector width; 0-size dims must not reach the kernel.
SHAPES = [(), (1,), (7,), (33,), (4097,), (3, 0), (0,), (2, 7, 33)]

# NumPy broadcasting: scalar-shaped on either side, rank extension, and both sides at once.
BROADCASTS = [
    ((), (33,)),
    ((7, 33), ()),
    ((2, 33), (33,)),
    ((1,), (4097,)),
    ((4, 1), (1, 7)),
    ((3, 1, 5), (4, 5)),
    ((5, 1, 33), (1, 3, 1)),
    ((0, 3), (1, 3)),
]


def check(rng, framework, dtype, x_shape, y_shape):
    x = to_framework(random(rng, x_shape, dtype), framework, dtype)
    y = to_framework(random(rng, y_shape, dtype), framework, dtype)
    want = to_float64(x) + to_float64(y)
    got = opforge.add(x, y)
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
def test_jax(simd_target, rng, framework, dtype):
    check(rng, framework, dtype, (7, 33), (33,))


@pytest.mark.parametrize("framework, kind", [(f, k) for f in ("numpy", "torch") for k in STRIDED_KINDS[f]])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int32"])
def test_strided(simd_target, rng, framework, kind, dtype):
    # Each operand strided in turn, and both: the kernel has SIMD paths for strides 1 and 0
    # and a scalar path for the rest.
    shape = (5, 33)
    x, x64 = strided(rng, shape, framework, dtype, kind)
    y = to_framework(random(rng, shape, dtype), framework, dtype)
    y64 = to_float64(y)
    for a, b, want in [(x, y, x64 + y64), (y, x, y64 + x64), (x, x, x64 + x64)]:
        got = opforge.add(a, b)
        assert_result(got, framework, dtype, shape)
        assert_close(got, want, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["torch"], ["float32", "bfloat16"]))
def test_strided_broadcast_against_row(simd_target, rng, framework, dtype):
    # A transposed operand plus a broadcast row: neither is contiguous along the output's rows.
    x, x64 = strided(rng, (33, 7), framework, dtype, "transposed")
    y = to_framework(random(rng, (33,), dtype), framework, dtype)
    got = opforge.add(x.T, y)
    assert_close(got, x64.T + to_float64(y), dtype)


@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], ["float32", "bfloat16", "int64"]))
def test_large(simd_target, rng, framework, dtype):
    # 1<<20 elements: enough chunks for every worker of the thread pool.
    check(rng, framework, dtype, (1 << 10, 1 << 10), (1 << 10,))


@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_nan_inf(simd_target, framework, dtype):
    special = np.array([np.nan, np.inf, -np.inf, 1.5, -0.0])
    # Every pair, laid out 37 long so specials hit both the SIMD body and the scalar tail.
    x64 = np.resize(np.repeat(special, 5), 37)
    y64 = np.resize(np.tile(special, 5), 37)
    got = opforge.add(to_framework(x64, framework, dtype), to_framework(y64, framework, dtype))
    with np.errstate(invalid="ignore"):  # inf + -inf
        want = x64 + y64
    assert_close(got, want, dtype)


def test_output_is_fresh(simd_target, rng):
    # Results own their memory: writing into one must not touch the inputs.
    x = rng.standard_normal(33)
    y = rng.standard_normal(33)
    x_before = x.copy()
    got = opforge.add(x, y)
    got[:] = 0
    np.testing.assert_array_equal(x, x_before)
