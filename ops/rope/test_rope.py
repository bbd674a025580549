"""rope against an independent float64 NumPy rotation in both pairings (half-split and
interleaved), on every float dtype, SIMD target and layout; against HF's rotate_half and
GPT-J's rotate_every_two as written in torch; every error path."""

import numpy as np
import pytest

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, assert_close, assert_result, cases, has_dtype, random,
                             strided, to_float64, to_framework)
from opforge.testing import torch  # None without torch: its cases skip, NumPy's still run
from opforge.references import rope as rope_reference

# [..., seq, heads, dim]: half = dim / 2 odd (7, 4097) leaves SIMD tails; ranks 3 to 5.
SHAPES = [(1, 1, 2), (7, 3, 14), (1, 2, 8194), (2, 4, 3, 16), (2, 3, 5, 2, 32), (0, 2, 4), (2, 0, 3, 4), (3, 2, 0)]


def rotate(x, cos, sin, interleaved, inverse=False):
    """float64: pair (a, b) -> (a*c - b*s, a*s + b*c), s negated for the inverse."""
    half = x.shape[-1] // 2
    i = np.arange(half)
    ia, ib = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
    c, s = cos[:, None, :], (-1 if inverse else 1) * sin[:, None, :]
    a, b = x[..., ia], x[..., ib]
    out = np.empty_like(x)
    out[..., ia] = a * c - b * s
    out[..., ib] = a * s + b * c
    return out


def arrays(rng, shape, framework, dtype):
    cos, sin = rope_reference.tables(shape[-3], shape[-1])
    cos = cos + 0.1 * rng.standard_normal(cos.shape)  # not only exact angles: the op takes any table
    return [to_framework(a, framework, dtype) for a in (random(rng, shape, dtype), cos, sin)]


def check(x, cos, sin, interleaved, framework, dtype):
    got = opforge.rope(x, cos, sin, interleaved)
    want = rotate(to_float64(x), to_float64(cos), to_float64(sin), interleaved)
    assert_result(got, framework, dtype, want.shape)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_shapes(simd_target, rng, framework, dtype, shape, interleaved):
    check(*arrays(rng, shape, framework, dtype), interleaved, framework, dtype)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("framework, dtype", cases(["jax"], FLOAT_DTYPES))
def test_jax(simd_target, rng, framework, dtype, interleaved):
    import jax

    import opforge.jax as oj

    x, cos, sin = arrays(rng, (2, 5, 3, 18), framework, dtype)
    check(x, cos, sin, interleaved, framework, dtype)
    got = jax.jit(lambda *a: oj.rope(*a, interleaved=interleaved))(x, cos, sin)
    assert_close(got, rotate(*map(to_float64, (x, cos, sin)), interleaved), dtype)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matches_llm_code(rng, dtype, interleaved):
    # HF llama's rotate_half and GPT-J's rotate_every_two, with cos/sin spread to full width.
    x, cos, sin = arrays(rng, (3, 11, 4, 64), "torch", dtype)
    torch.testing.assert_close(opforge.rope(x, cos, sin, interleaved), rope_reference.torch(x, cos, sin, interleaved))


@pytest.mark.parametrize("framework, kind, dtype", [
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in FLOAT_DTYPES if has_dtype(f, d)])
def test_strided(simd_target, rng, framework, kind, dtype):
    # Strided x (transposed: the pairs' own dim is strided and rows are gathered), strided tables.
    x, cos, sin = arrays(rng, (2, 5, 3, 10), framework, dtype)
    x_view, _ = strided(rng, (2, 5, 3, 10), framework, dtype, kind)
    cos_view, _ = strided(rng, (5, 5), framework, dtype, kind)
    sin_view, _ = strided(rng, (5, 5), framework, dtype, kind)
    for interleaved in (False, True):
        check(x_view, cos, sin, interleaved, framework, dtype)
        check(x, cos_view, sin_view, interleaved, framework, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_large(simd_target, rng, dtype):
    # Many (batch, position) groups: split across the thread pool.
    check(*arrays(rng, (4, 128, 8, 128), "torch", dtype), True, "torch", dtype)


def test_nan_inf_stay_in_their_pair(rng):
    x, cos, sin = arrays(rng, (2, 3, 8), "numpy", "float32")
    x[1, 2, 0] = np.nan
    x[0, 1, 5] = np.inf
    for interleaved in (False, True):
        got = opforge.rope(x, cos, sin, interleaved)
        with np.errstate(invalid="ignore"):
            want = rotate(x.astype(np.float64), cos.astype(np.float64), sin.astype(np.float64), interleaved)
        assert_close(got, want, "float32")
        assert np.isfinite(got[0, 0]).all() and np.isfinite(got[1, :2]).all()


X = np.ones((2, 3, 8), np.float32)
T = np.ones((2, 4), np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.rope(np.ones((2, 3, 7), np.float32), T, T), ValueError,
     r"rope\(\): 'x' must have an even last dimension \(its pairs are rotated\), got shape \[2, 3, 7\]"),
    (lambda: opforge.rope(X, np.ones((3, 4), np.float32), T), ValueError,
     r"rope\(\): 'cos' must have shape \[2, 4\], got \[3, 4\]"),
    (lambda: opforge.rope(X, T, np.ones((2, 8), np.float32)), ValueError,
     r"rope\(\): 'sin' must have shape \[2, 4\], got \[2, 8\]"),
    (lambda: opforge.rope(X, T.reshape(2, 4, 1), T), ValueError, r"rope\(\): 'cos' must have rank 2, got rank 3"),
    (lambda: opforge.rope(X[0], T, T), ValueError, r"rope\(\): 'x' must have rank >= 3, got rank 2 \(shape \[3, 8\]\)"),
    (lambda: opforge.rope(X, T.astype(np.float64), T), TypeError,
     r"rope\(\): 'cos' must have dtype float32 like 'x', got float64"),
    (lambda: opforge.rope(X.astype(np.int32), T.astype(np.int32), T.astype(np.int32)), TypeError,
     r"rope\(\): 'x' must have dtype in \[float32, float64, float16, bfloat16\], got int32"),
    (lambda: opforge.rope(X, T, T, interleaved="yes"), TypeError, r"rope\(\): 'interleaved' must be a bool"),
    (lambda: opforge.rope(X, T), TypeError, r"rope\(\) missing required argument 'sin'"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
