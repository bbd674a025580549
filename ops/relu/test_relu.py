"""relu against NumPy float64 and torch on every float dtype, SIMD target and layout."""

import numpy as np
import pytest

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, assert_close, assert_result, cases, has_dtype, random,
                             strided, to_float64, to_framework)
from opforge.testing import torch  # None without torch: its cases skip, NumPy's still run

# Odd lengths leave SIMD tails on every vector width; 0-size dims must not reach the kernel.
SHAPES = [(), (1,), (7,), (4097,), (0,), (4, 0, 3), (3, 5, 7)]


def reference(x64):
    return np.where(np.isnan(x64) | (x64 > 0), x64, 0.0)


def check(x, framework, dtype):
    want = reference(to_float64(x))
    got = opforge.relu(x)
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
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in FLOAT_DTYPES if has_dtype(f, d)])
@pytest.mark.parametrize("shape", [(33,), (2, 3, 7)], ids=str)
def test_strided(simd_target, rng, framework, kind, dtype, shape):
    check(strided(rng, shape, framework, dtype, kind)[0], framework, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_large_matches_torch(simd_target, rng, dtype):
    # 1<<20 elements: enough chunks for every worker of the thread pool. Exact in every dtype.
    x = to_framework(random(rng, (1 << 20,), dtype), "torch", dtype)
    assert torch.equal(opforge.relu(x), torch.relu(x))


@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_nan_inf(simd_target, framework, dtype):
    # 37 long so the specials land in both the SIMD body and the tail.
    x64 = np.resize([np.nan, np.inf, -np.inf, -1.0, 0.5, 0.0, -0.0], 37)
    check(to_framework(x64, framework, dtype), framework, dtype)


def test_declared():
    op = opforge._core.op("relu")
    assert op.backward == ("relu_backward", ["x"])
    assert op.leading_dim_args == ["x"]


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.relu(np.ones(3, np.int32)), TypeError,
     r"relu\(\): 'x' must have dtype in \[float32, float64, float16, bfloat16\], got int32"),
    (lambda: opforge.relu(), TypeError, r"relu\(\) missing required argument 'x'"),
    (lambda: opforge.relu([1.0]), TypeError, r"relu\(\): 'x' must be an array .*got list"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
