"""rms_norm against NumPy float64 on every dtype, SIMD target and row layout it accepts."""

import numpy as np
import pytest

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, assert_close, assert_result, cases, has_dtype, random,
                             strided, to_float64, to_framework)

# Odd row lengths leave tails after the 4-accumulator loop and the 1-vector loop alike.
SHAPES = [(1,), (7,), (1, 1), (3, 33), (2, 4097), (2, 3, 7), (0, 5), (4, 0)]


def reference(x64, w64, eps=1e-6):
    if x64.size == 0:
        return np.empty_like(x64)
    with np.errstate(invalid="ignore", over="ignore"):  # rows holding inf or NaN
        return x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * w64


def check(x, w, framework, dtype, eps=None):
    want = reference(to_float64(x), to_float64(w), 1e-6 if eps is None else eps)
    got = opforge.rms_norm(x, w) if eps is None else opforge.rms_norm(x, w, eps=eps)
    assert_result(got, framework, dtype, want.shape)
    assert_close(got, want, dtype)


def arrays(rng, shape, framework, dtype):
    x = to_framework(random(rng, shape, dtype), framework, dtype)
    w = to_framework(random(rng, shape[-1:], dtype), framework, dtype)
    return x, w


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


@pytest.mark.parametrize("framework, kind, dtype", [
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in FLOAT_DTYPES if has_dtype(f, d)])
def test_strided_rows(simd_target, rng, framework, kind, dtype):
    # Rows that are not contiguous are gathered by the kernel; their results must not differ.
    x, _ = strided(rng, (6, 40), framework, dtype, kind)
    w = to_framework(random(rng, (40,), dtype), framework, dtype)
    check(x, w, framework, dtype)


@pytest.mark.parametrize("framework, kind, dtype", [
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] if k != "transposed"
    for d in FLOAT_DTYPES if has_dtype(f, d)])
def test_strided_weight(simd_target, rng, framework, kind, dtype):
    # "broadcast" of a rank-1 weight is one value with stride 0.
    x = to_framework(random(rng, (6, 40), dtype), framework, dtype)
    w, _ = strided(rng, (40,), framework, dtype, kind)
    check(x, w, framework, dtype)
    x_view, _ = strided(rng, (6, 40), framework, dtype, "step")
    check(x_view, w, framework, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], ["float32", "bfloat16"]))
def test_large(simd_target, rng, framework, dtype):
    # 1<<20 elements in 256 rows: rows are split across the thread pool.
    check(*arrays(rng, (256, 4096), framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_nan_inf(simd_target, rng, framework, dtype):
    # A NaN poisons its own row only; an inf makes its row's sum inf, so the others become 0
    # and the inf itself inf/inf = NaN, exactly as the float64 formula says.
    x64 = rng.standard_normal((4, 37))
    x64[1, 3] = np.nan
    x64[2, 36] = np.inf
    x64[3, 0] = -np.inf
    w = to_framework(random(rng, (37,), dtype), framework, dtype)
    check(to_framework(x64, framework, dtype), w, framework, dtype)


@pytest.mark.parametrize("dtype, scale, eps", [
    ("float64", 1e15, 1e-6),
    ("float64", 1e150, 1e-6),  # squares near 1e300: still finite in float64
    ("float64", 1e-150, 0.0),  # squares near 1e-300: still normal in float64
    ("float32", 1e15, 1e-6),  # squares near 1e30
    ("float32", 1e-15, 0.0),  # squares near 1e-30
])
def test_extreme_magnitudes(simd_target, rng, dtype, scale, eps):
    # The result is scale-free, so it must stay finite and accurate wherever x*x is finite.
    # (float32 accumulates in float32: beyond ~1e19 the sum of squares overflows, as in torch.)
    x = (rng.standard_normal((3, 257)) * scale).astype(dtype)
    w = rng.standard_normal(257).astype(dtype)
    got = opforge.rms_norm(x, w, eps=eps)
    assert np.isfinite(got).all()
    assert_close(got, reference(x.astype(np.float64), w.astype(np.float64), eps), dtype)
