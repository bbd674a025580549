"""softmax against NumPy float64 (and torch for its special values) on every dtype, SIMD target and
row layout it accepts; both of the kernel's paths (cached rows, long online rows)."""

import numpy as np
import pytest

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, assert_close, assert_result, cases, has_dtype, random,
                             strided, to_float64, to_framework)
from opforge.testing import torch  # None without torch: its cases skip, NumPy's still run

# Odd row lengths leave tails after the two-vector loop and the one-vector loop alike.
SHAPES = [(1,), (7,), (1, 1), (3, 33), (2, 4097), (2, 3, 7), (0, 5), (4, 0)]
# Past 256 KiB of float scratch a row takes the online path (70001 floats, or doubles).
LONG_ROW = 70001


def reference(x64):
    """Float64 softmax for finite rows (special values are checked against torch)."""
    if x64.size == 0:
        return np.empty_like(x64)
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def check(x, framework, dtype):
    want = reference(to_float64(x))
    got = opforge.softmax(x)
    assert_result(got, framework, dtype, want.shape)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_shapes(simd_target, rng, framework, dtype, shape):
    check(to_framework(random(rng, shape, dtype), framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["jax"], FLOAT_DTYPES))
def test_jax(simd_target, rng, framework, dtype):
    check(to_framework(random(rng, (3, 33), dtype), framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, kind, dtype", [
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in FLOAT_DTYPES if has_dtype(f, d)])
def test_strided_rows(simd_target, rng, framework, kind, dtype):
    x, _ = strided(rng, (6, 40), framework, dtype, kind)
    check(x, framework, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["torch"], FLOAT_DTYPES))
def test_long_rows(simd_target, rng, framework, dtype):
    # The online path, with a tail, a strided row and a row of widely spread values (the
    # running max grows often, so the rescaling matters).
    x64 = rng.standard_normal((3, LONG_ROW))
    x64[2] *= 30
    check(to_framework(x64, framework, dtype), framework, dtype)
    view, _ = strided(rng, (2, LONG_ROW), framework, dtype, "step")
    check(view, framework, dtype)


# Outputs of 8 MiB and more (float32, float64) are written with non-temporal stores; 4097 leaves
# rows unaligned, so each starts with scalar stores. bfloat16 takes the ordinary stores.
LARGE = [pytest.param(f, d, s, id=f"{f}-{d}") for f, d, s in
         [("numpy", "float32", (520, 4097)), ("torch", "float64", (260, 4097)), ("torch", "bfloat16", (256, 4096))]]


@pytest.mark.parametrize("framework, dtype, shape", LARGE)
def test_large(simd_target, rng, framework, dtype, shape):
    check(to_framework(random(rng, shape, dtype), framework, dtype), framework, dtype)


@pytest.mark.parametrize("n", [33, LONG_ROW], ids=["cached", "online"])
@pytest.mark.parametrize("dtype, scale", [("float32", 1e4), ("float32", 1e30), ("float64", 1e300),
                                          ("float16", 1e4), ("bfloat16", 1e30)])
def test_no_overflow(simd_target, rng, dtype, scale, n):
    # exp(x) alone would overflow; exp(x - max) cannot.
    x = to_framework(rng.standard_normal((2, n)) * scale, "torch", dtype)
    got = opforge.softmax(x)
    assert torch.isfinite(got).all()
    assert_close(got, reference(to_float64(x)), dtype)


def special_rows(n):
    """Rows with -inf, NaN, +inf, only -inf, and a finite control row."""
    rows = np.random.default_rng(0).standard_normal((6, n))
    rows[0, ::3] = -np.inf  # masked entries: 0, the rest a softmax of their own
    rows[1, n // 2] = np.nan
    rows[2, -1] = np.inf
    rows[3, :] = -np.inf
    rows[4, 0] = -np.inf
    rows[4, 1:] = 6e4  # large, yet finite in every dtype
    return rows


@pytest.mark.parametrize("n", [7, 33, LONG_ROW], ids=["short", "cached", "online"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_special_values_match_torch(simd_target, dtype, n):
    # torch: -inf entries get 0; a row with NaN, +inf, or only -inf is NaN throughout.
    x = to_framework(special_rows(n), "torch", dtype)
    want = torch.softmax(x.double(), dim=-1).numpy()
    assert np.isnan(want[[1, 2, 3]]).all() and np.isfinite(want[[0, 4, 5]]).all()
    got = opforge.softmax(x)
    assert_close(got, want, dtype)
    assert (to_float64(got)[0, ::3] == 0).all() and to_float64(got)[4, 0] == 0  # masked: exactly 0


@pytest.fixture
def restore_threads():
    before = opforge.num_threads()
    yield
    opforge.set_num_threads(before)


def test_same_result_on_any_thread_count(rng, restore_threads):
    x = to_framework(random(rng, (64, 1000), "float32"), "torch", "float32")
    results = []
    for threads in (1, 2):
        opforge.set_num_threads(threads)
        results.append(opforge.softmax(x))
    assert torch.equal(results[0], results[1])


def test_declaration():
    op = opforge._core.op("softmax")
    assert op.backward == ("softmax_backward", ["x"])
    assert op.leading_dim_args == ["x"]


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.softmax(np.ones((2, 3), np.int32)), TypeError,
     r"softmax\(\): 'x' must have dtype in \[float32, float64, float16, bfloat16\], got int32"),
    (lambda: opforge.softmax(np.array(1.0, np.float32)), ValueError, r"softmax\(\): 'x' must have rank >= 1, got rank 0"),
    (lambda: opforge.softmax(), TypeError, r"softmax\(\) missing required argument 'x'"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
