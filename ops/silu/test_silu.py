"""silu against NumPy float64 and torch on every float dtype, SIMD target and layout, out to the
far tails."""

import numpy as np
import pytest

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, assert_close, assert_result, cases, has_dtype, random,
                             strided, to_float64, to_framework)
from opforge.testing import torch  # None without torch: its cases skip, NumPy's still run

SHAPES = [(), (1,), (7,), (4097,), (0,), (4, 0, 3), (3, 5, 7)]


def reference(x64):
    with np.errstate(over="ignore"):
        return x64 / (1 + np.exp(-x64))


def check(x, framework, dtype):
    want = reference(to_float64(x))
    got = opforge.silu(x)
    assert_result(got, framework, dtype, want.shape)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_shapes(simd_target, rng, framework, dtype, shape):
    check(to_framework(random(rng, shape, dtype), framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["jax"], FLOAT_DTYPES))
def test_jax(rng, framework, dtype):
    check(to_framework(random(rng, (3, 33), dtype), framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, kind, dtype", [
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in ("float32", "float64", "bfloat16")
    if has_dtype(f, d)])
def test_strided(simd_target, rng, framework, kind, dtype):
    check(strided(rng, (5, 33), framework, dtype, kind)[0], framework, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_wide_range(simd_target, rng, dtype):
    # Far into both tails, where exp(-x) overflows in the textbook formula.
    check(to_framework(rng.uniform(-200, 200, 4099), "torch", dtype), "torch", dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_large_matches_torch(simd_target, rng, dtype):
    # 1<<20 elements: every worker of the thread pool.
    x = to_framework(random(rng, (1 << 20,), dtype), "torch", dtype)
    got = opforge.silu(x)
    assert_close(got, torch.nn.functional.silu(x.double()).numpy(), dtype)
    torch.testing.assert_close(got, torch.nn.functional.silu(x))


@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_nan_inf(simd_target, framework, dtype):
    # The limits at +-inf (torch gives NaN at -inf); 37 long for the SIMD body and the tail.
    x64 = np.resize([np.nan, np.inf, -np.inf, -1000.0, 1000.0, 0.0, -0.0, -1.0], 37)
    want = np.where(np.isinf(x64), np.maximum(x64, 0), reference(np.nan_to_num(x64, posinf=0, neginf=0)))
    want[np.isnan(x64)] = np.nan
    assert_close(opforge.silu(to_framework(x64, framework, dtype)), want, dtype)


def test_declared():
    op = opforge._core.op("silu")
    assert op.backward == ("silu_backward", ["x"])
    assert op.leading_dim_args == ["x"]


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.silu(np.ones(3, np.int32)), TypeError,
     r"silu\(\): 'x' must have dtype in \[float32, float64, float16, bfloat16\], got int32"),
    (lambda: opforge.silu(), TypeError, r"silu\(\) missing required argument 'x'"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
