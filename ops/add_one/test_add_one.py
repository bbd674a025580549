"""add_one against NumPy float64 on every dtype, SIMD target and layout it accepts."""

import numpy as np
import pytest

import opforge
from opforge.testing import (FLOAT_DTYPES, INT_DTYPES, STRIDED_KINDS, assert_close, assert_result, cases, has_dtype,
                             random, strided, to_float64, to_framework)
from opforge.testing import rng, simd_target  # noqa: F401  (fixtures, so the file runs outside the checkout too)

DTYPES = FLOAT_DTYPES + INT_DTYPES

# Odd lengths leave SIMD tails on every vector width; 0-size dims must not reach the kernel.
SHAPES = [(), (1,), (7,), (33,), (4097,), (0,), (4, 0, 3), (3, 5, 7)]


def check(x, framework, dtype):
    want = to_float64(x) + 1
    got = opforge.add_one(x)
    assert_result(got, framework, dtype, want.shape)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], DTYPES))
def test_shapes(simd_target, rng, framework, dtype, shape):
    check(to_framework(random(rng, shape, dtype), framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["jax"], DTYPES))
def test_jax(simd_target, rng, framework, dtype):
    check(to_framework(random(rng, (3, 33), dtype), framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, kind, dtype", [
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in DTYPES if has_dtype(f, d)])
@pytest.mark.parametrize("shape", [(33,), (5, 33), (2, 3, 7)], ids=str)
def test_strided(simd_target, rng, framework, kind, dtype, shape):
    x, _ = strided(rng, shape, framework, dtype, kind)
    check(x, framework, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], ["float32", "float16", "int32"]))
def test_large(simd_target, rng, framework, dtype):
    # 1<<20 elements: enough chunks for every worker of the thread pool.
    check(to_framework(random(rng, (1 << 20,), dtype), framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_nan_inf(simd_target, framework, dtype):
    # 37 long so the specials land in both the SIMD body and the scalar tail.
    x64 = np.resize([np.nan, np.inf, -np.inf, -1.0, 0.5], 37)
    check(to_framework(x64, framework, dtype), framework, dtype)


@pytest.mark.parametrize("dtype, big", [("int32", 2**31 - 1), ("int64", 2**63 - 1)])
def test_integer_wraps(simd_target, dtype, big):
    # Integer overflow wraps like NumPy's and torch's (two's complement), it does not saturate.
    x = np.full(9, big, dtype=dtype)
    np.testing.assert_array_equal(opforge.add_one(x), np.full(9, np.iinfo(dtype).min, dtype=dtype))
