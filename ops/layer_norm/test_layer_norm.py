"""layer_norm against NumPy float64 and torch on every dtype, SIMD target and row layout it accepts,
with and without bias; precision on rows whose mean dwarfs their spread."""

import numpy as np
import pytest

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, TOLERANCES, assert_result, cases, has_dtype, random,
                             strided, to_float64, to_framework)
from opforge.testing import torch  # None without torch: its cases skip, NumPy's still run

# Odd row lengths leave tails after the unrolled loops and the one-vector loops alike.
SHAPES = [(1,), (7,), (1, 1), (3, 33), (2, 4097), (2, 3, 7), (0, 5), (4, 0)]
# Relative precision the kernel computes in: float32 for the half types.
COMPUTE_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-24, "bfloat16": 2.0**-24}


def reference(x64, w64, b64=None, eps=1e-5):
    """The float64 result, and the magnitude of its terms: xhat * w + b can cancel."""
    if x64.size == 0:
        return np.empty_like(x64), np.empty_like(x64)
    with np.errstate(invalid="ignore", over="ignore"):  # rows holding inf or NaN
        # Shifting by the row's first value first is exact for rows with a large mean, where a
        # float64 mean alone would be off by half an ulp of 1e12 (6e-5).
        x64 = x64 - x64[..., :1]
        d = x64 - x64.mean(axis=-1, keepdims=True)
        out = d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + eps) * w64
    return (out, np.abs(out)) if b64 is None else (out + b64, np.abs(out) + np.abs(b64))


def assert_close(got, want, scale, dtype):
    """Within dtype's tolerance, plus a few ulps (of the compute type) of the terms' magnitudes.
    NaN must meet NaN."""
    rtol, atol = TOLERANCES[dtype]
    allowed = atol + 8 * COMPUTE_EPS[dtype] * scale + rtol * np.abs(want)
    g = to_float64(got)
    assert g.shape == want.shape
    with np.errstate(invalid="ignore"):
        bad = ~((np.abs(g - want) <= allowed) | (np.isnan(g) & np.isnan(want)) | (g == want))
    assert not bad.any(), f"{bad.sum()} of {bad.size} off: got {g[bad][:5]}, want {want[bad][:5]}"


def check(x, w, b, framework, dtype, eps=None):
    want, scale = reference(to_float64(x), to_float64(w), None if b is None else to_float64(b),
                            1e-5 if eps is None else eps)
    got = opforge.layer_norm(x, w, b) if eps is None else opforge.layer_norm(x, w, b, eps=eps)
    assert_result(got, framework, dtype, want.shape)
    assert_close(got, want, scale, dtype)


def arrays(rng, shape, framework, dtype):
    return [to_framework(random(rng, s, dtype), framework, dtype) for s in (shape, shape[-1:], shape[-1:])]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_shapes(simd_target, rng, framework, dtype, shape):
    x, w, b = arrays(rng, shape, framework, dtype)
    check(x, w, b, framework, dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["torch"], FLOAT_DTYPES))
def test_no_bias(simd_target, rng, framework, dtype, shape):
    x, w, _ = arrays(rng, shape, framework, dtype)
    check(x, w, None, framework, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["jax"], FLOAT_DTYPES))
def test_jax(simd_target, rng, framework, dtype):
    x, w, b = arrays(rng, (3, 33), framework, dtype)
    check(x, w, b, framework, dtype)
    check(x, w, None, framework, dtype)


@pytest.mark.parametrize("shape", [(5, 33), (2, 3, 4097)], ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_matches_torch(rng, shape, bias):
    x, w, b = [torch.from_numpy(a) for a in (rng.standard_normal(shape), rng.standard_normal(shape[-1]),
                                              rng.standard_normal(shape[-1]))]
    b = b if bias else None
    want = torch.nn.functional.layer_norm(x, shape[-1:], w, b, 1e-5)
    torch.testing.assert_close(opforge.layer_norm(x, w, b), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("eps", [0.0, 1e-2, 1.0, 3], ids=str)  # an int is a valid float
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_eps(simd_target, rng, dtype, eps):
    x, w, b = arrays(rng, (4, 33), "numpy", dtype)
    check(x, w, b, "numpy", dtype, eps=eps)


@pytest.mark.parametrize("framework, kind, dtype", [
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in FLOAT_DTYPES if has_dtype(f, d)])
def test_strided_rows(simd_target, rng, framework, kind, dtype):
    x, _ = strided(rng, (6, 40), framework, dtype, kind)
    _, w, b = arrays(rng, (6, 40), framework, dtype)
    check(x, w, b, framework, dtype)


@pytest.mark.parametrize("framework, kind, dtype", [
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] if k != "transposed"
    for d in FLOAT_DTYPES if has_dtype(f, d)])
def test_strided_weight_and_bias(simd_target, rng, framework, kind, dtype):
    # "broadcast" of a rank-1 tensor is one value with stride 0.
    x, w, b = arrays(rng, (6, 40), framework, dtype)
    w_view, _ = strided(rng, (40,), framework, dtype, kind)
    b_view, _ = strided(rng, (40,), framework, dtype, kind)
    check(x, w_view, b, framework, dtype)
    check(x, w, b_view, framework, dtype)
    check(strided(rng, (6, 40), framework, dtype, "step")[0], w_view, b_view, framework, dtype)


# Outputs of 8 MiB and more (float32, float64) are written with non-temporal stores; 4097 leaves
# rows unaligned, so each starts with scalar stores. bfloat16 takes the ordinary stores.
LARGE = [pytest.param(f, d, s, id=f"{f}-{d}") for f, d, s in
         [("numpy", "float32", (520, 4097)), ("torch", "float64", (260, 4097)), ("torch", "bfloat16", (256, 4096))]]


@pytest.mark.parametrize("framework, dtype, shape", LARGE)
def test_large(simd_target, rng, framework, dtype, shape):
    check(*arrays(rng, shape, framework, dtype), framework, dtype)


@pytest.mark.parametrize("n", [7, 33, 4097], ids=str)
@pytest.mark.parametrize("dtype, mean", [("float32", 1e4), ("float32", -3e5), ("float64", 1e12),
                                         ("bfloat16", 100.0), ("float16", 300.0)])
def test_large_mean(simd_target, rng, dtype, mean, n):
    # mean + N(0, 1): a naive E[x^2] - E[x]^2 in the compute type cancels catastrophically, and a
    # mean rounded to one float32 number is off by up to 5e-4 at 1e4. The result must still be
    # as accurate as for zero-mean rows, against float64 on the values the op saw.
    x = to_framework(mean + rng.standard_normal((3, n)), "torch", dtype)
    _, w, b = arrays(rng, (3, n), "torch", dtype)
    check(x, w, b, "torch", dtype)


@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_nan_inf(simd_target, rng, framework, dtype):
    # A NaN or an inf poisons its own row only, as the float64 formula says.
    x64 = rng.standard_normal((4, 37))
    x64[1, 3] = np.nan
    x64[2, 36] = np.inf
    x64[3, 0] = -np.inf
    _, w, b = arrays(rng, (4, 37), framework, dtype)
    check(to_framework(x64, framework, dtype), w, b, framework, dtype)
    got = to_float64(opforge.layer_norm(to_framework(x64, framework, dtype), w, b))
    assert np.isnan(got[1:]).all() and np.isfinite(got[0]).all()


def test_constant_rows(rng):
    # Zero variance: xhat is 0, so the result is the bias (NaN with eps=0, as in torch).
    x = np.full((2, 9), 2.5, np.float32)
    w, b = rng.standard_normal(9).astype(np.float32), rng.standard_normal(9).astype(np.float32)
    np.testing.assert_array_equal(opforge.layer_norm(x, w, b), np.broadcast_to(b, (2, 9)))
    assert np.isnan(opforge.layer_norm(x, w, b, eps=0.0)).all()


def test_declaration():
    op = opforge._core.op("layer_norm")
    assert op.backward == ("layer_norm_backward", ["x", "weight", "bias"])
    assert op.leading_dim_args == ["x"]


X = np.ones((2, 3), np.float32)
W = np.ones(3, np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.layer_norm(X, np.ones(4, np.float32)), ValueError,
     r"layer_norm\(\): 'weight' must have shape \[3\], got \[4\]"),
    (lambda: opforge.layer_norm(X, W, np.ones(2, np.float32)), ValueError,
     r"layer_norm\(\): 'bias' must have shape \[3\], got \[2\]"),
    (lambda: opforge.layer_norm(X, W, X), ValueError,
     r"layer_norm\(\): 'bias' must have rank 1, got rank 2 \(shape \[2, 3\]\)"),
    (lambda: opforge.layer_norm(X, W.reshape(1, 3)), ValueError,
     r"layer_norm\(\): 'weight' must have rank 1, got rank 2 \(shape \[1, 3\]\)"),
    (lambda: opforge.layer_norm(np.array(1.0, np.float32), W), ValueError,
     r"layer_norm\(\): 'x' must have rank >= 1, got rank 0 \(shape \[\]\)"),
    (lambda: opforge.layer_norm(X, W.astype(np.float64)), TypeError,
     r"layer_norm\(\): 'weight' must have dtype float32 like 'x', got float64"),
    (lambda: opforge.layer_norm(X, W, W.astype(np.float16)), TypeError,
     r"layer_norm\(\): 'bias' must have dtype float32 like 'x', got float16"),
    (lambda: opforge.layer_norm(X.astype(np.int32), W.astype(np.int32)), TypeError,
     r"layer_norm\(\): 'x' must have dtype in \[float32, float64, float16, bfloat16\], got int32"),
    (lambda: opforge.layer_norm(X, W, eps=-1.0), ValueError, r"layer_norm\(\): 'eps' must be >= 0, got -1"),
    (lambda: opforge.layer_norm(X, W, eps="a"), TypeError, r"layer_norm\(\): 'eps' must be a float, got str"),
    (lambda: opforge.layer_norm(X), TypeError, r"layer_norm\(\) missing required argument 'weight'"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
