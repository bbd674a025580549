"""gelu (exact and tanh forms) against NumPy float64 and torch on every float dtype, SIMD target
and layout, out to the far tails."""

import math

import numpy as np
import pytest

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, assert_close, assert_result, cases, has_dtype, random,
                             strided, to_float64, to_framework)
from opforge.testing import torch  # None without torch: its cases skip, NumPy's still run

SHAPES = [(), (1,), (7,), (4097,), (0,), (4, 0, 3), (3, 5, 7)]
FORMS = ["none", "tanh"]
erfc = np.vectorize(math.erfc, otypes=[np.float64])


def reference(x64, approximate):
    if approximate == "tanh":
        with np.errstate(over="ignore", invalid="ignore"):
            return 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    return 0.5 * x64 * erfc(-x64 / math.sqrt(2))


def check(x, framework, dtype, approximate):
    want = reference(to_float64(x), approximate)
    got = opforge.gelu(x, approximate=approximate)
    assert_result(got, framework, dtype, want.shape)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("approximate", FORMS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_shapes(simd_target, rng, framework, dtype, shape, approximate):
    check(to_framework(random(rng, shape, dtype), framework, dtype), framework, dtype, approximate)


def test_default_is_exact(rng):
    x = rng.standard_normal(33)
    np.testing.assert_array_equal(opforge.gelu(x), opforge.gelu(x, approximate="none"))
    np.testing.assert_array_equal(opforge.gelu(x, "tanh"), opforge.gelu(x, approximate="tanh"))


@pytest.mark.parametrize("approximate", FORMS)
@pytest.mark.parametrize("framework, dtype", cases(["jax"], FLOAT_DTYPES))
def test_jax(rng, framework, dtype, approximate):
    check(to_framework(random(rng, (3, 33), dtype), framework, dtype), framework, dtype, approximate)


@pytest.mark.parametrize("framework, kind, dtype", [
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in ("float32", "float64", "bfloat16")
    if has_dtype(f, d)])
def test_strided(simd_target, rng, framework, kind, dtype):
    for approximate in FORMS:
        check(strided(rng, (5, 33), framework, dtype, kind)[0], framework, dtype, approximate)


@pytest.mark.parametrize("approximate", FORMS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_wide_range(simd_target, rng, dtype, approximate):
    # Far into both tails, where exp and x^3 would overflow in the textbook formulas.
    x = to_framework(rng.uniform(-60, 60, 4099), "torch", dtype)
    check(x, "torch", dtype, approximate)


@pytest.mark.parametrize("dtype, low, rtol", [("float32", -13, 1e-5), ("float64", -30, 1e-12)])
def test_left_tail_relative_accuracy(simd_target, rng, dtype, low, rtol):
    # Phi comes from erfc, not 1 + erf, so tiny results keep their relative accuracy: float32
    # down to x = -13, gelu(x) = -8e-38, just above the smallest normal float (Phi(x) itself
    # is subnormal past -12.9; the kernels keep it 2^24 larger until the product with x).
    x64 = rng.uniform(low, -3, 4099).astype(dtype).astype(np.float64)
    got = opforge.gelu(x64.astype(dtype)).astype(np.float64)
    np.testing.assert_allclose(got, reference(x64, "none"), rtol=rtol, atol=0)


@pytest.mark.parametrize("approximate", FORMS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_large_matches_torch(simd_target, rng, dtype, approximate):
    # 1<<18 elements: 16 grains of work, every worker of the thread pool busy. Against torch
    # in float64, and torch in dtype itself: its float32 erf is good to ~1.5e-7 absolute only
    # (gelu to ~1.1e-6 near x = -4, past float32's atol), ours to ~1e-7 relative.
    x = to_framework(random(rng, (1 << 18,), dtype), "torch", dtype)
    got = opforge.gelu(x, approximate=approximate)
    assert_close(got, torch.nn.functional.gelu(x.double(), approximate=approximate).numpy(), dtype)
    theirs = torch.nn.functional.gelu(x, approximate=approximate)
    torch.testing.assert_close(got, theirs, rtol=1e-5 if dtype == "float32" else 1e-2, atol=3e-6)


@pytest.mark.parametrize("approximate", FORMS)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_nan_inf(simd_target, framework, dtype, approximate):
    # The limits at +-inf (torch gives NaN for some); 37 long for the SIMD body and the tail.
    x64 = np.resize([np.nan, np.inf, -np.inf, -1000.0, 1000.0, 0.0, -0.0, -1.0], 37)
    want = np.where(np.isinf(x64), np.maximum(x64, 0), reference(np.nan_to_num(x64, posinf=0, neginf=0), approximate))
    want[np.isnan(x64)] = np.nan
    got = opforge.gelu(to_framework(x64, framework, dtype), approximate=approximate)
    assert_close(got, want, dtype)


def test_declared():
    op = opforge._core.op("gelu")
    assert op.backward == ("gelu_backward", ["x"])
    assert op.leading_dim_args == ["x"]


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.gelu(np.ones(3), approximate="fast"), ValueError,
     r"gelu\(\): 'approximate' must be 'none' or 'tanh', got 'fast'"),
    (lambda: opforge.gelu(np.ones(3), approximate="Tanh"), ValueError,
     r"gelu\(\): 'approximate' must be 'none' or 'tanh', got 'Tanh'"),
    (lambda: opforge.gelu(np.ones(3), approximate=1), TypeError, r"gelu\(\): 'approximate' must be a str"),
    (lambda: opforge.gelu(np.ones(3, np.int64)), TypeError,
     r"gelu\(\): 'x' must have dtype in \[float32, float64, float16, bfloat16\], got int64"),
    (lambda: opforge.gelu(), TypeError, r"gelu\(\) missing required argument 'x'"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
