"""linear_act against a float64 NumPy reference (and torch) on every dtype, SIMD target, activation
and layout; shapes chosen so every kernel path runs: dot products (a side of few rows), packed
panels along either operand, several K and row blocks, edge tiles."""

import math

import numpy as np
import pytest
import torch

import opforge
import opforge.torch
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, TOLERANCES, assert_result, cases, has_dtype,
                             product_rounding, random, strided, to_float64, to_framework)
from opforge.references import linear_act as linear_act_reference

ACTS = ["none", "relu", "gelu", "gelu_tanh", "silu"]
# Relative precision of the arithmetic: float32 for the half types.
COMPUTE_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-24, "bfloat16": 2.0**-24}

# (m, n, k): m <= 5 or n <= 5 take dot products (on wide SIMD targets, x or weight the short side);
# the rest take packed panels along x (m < n) or weight (m > n); k = 513 spans two K blocks, m = 257
# with n = 300 two row blocks; odd sizes leave edge tiles everywhere; (1, 200, 96): a row against
# weight rows in several 64-row tasks of 8-row groups, each prefetching the next. A packed side of
# at most a vector's rows takes one-vector panels: x (7, 12, 14 rows) or the weight (9 rows); with
# AVX512_BF16's pairs, bfloat16 takes dot products up to 12 rows, so 14 is its one-vector case.
SHAPES = [(1, 7, 33), (1, 1, 1), (5, 65, 257), (65, 5, 33), (7, 1, 65), (7, 65, 33), (33, 65, 513), (257, 33, 65),
          (65, 65, 7), (257, 300, 33), (1, 200, 96), (12, 300, 513), (65, 9, 40), (14, 70, 66)]


def activate(z, act):
    if act == "relu":
        return np.maximum(z, 0)
    if act == "gelu":
        return 0.5 * z * np.vectorize(math.erfc, otypes=[np.float64])(-z / math.sqrt(2))
    if act == "gelu_tanh":
        return 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    if act == "silu":
        return z / (1 + np.exp(-z))
    return z


def reference(x, w, b, act):
    """act(x @ w^T + b) in float64 and the magnitude the sums ran over (|x| @ |w|^T + |b|)."""
    z = x @ w.T + (0 if b is None else b)
    scale = np.abs(x) @ np.abs(w).T + (0 if b is None else np.abs(b))
    return activate(z, act), scale


def check(x, w, b, framework, dtype, act="none"):
    x64, w64 = to_float64(x), to_float64(w)
    b64 = None if b is None else to_float64(b)
    want, scale = reference(x64, w64, b64, act)
    got = opforge.linear_act(x, w, b, act=act)
    assert_result(got, framework, dtype, want.shape)
    rtol, atol = TOLERANCES[dtype]
    # The dtype's tolerance, plus the worst case of rounding in a sum of k products (k ulps of
    # its magnitude); act's slope is at most 1.13.
    k = x64.shape[-1]
    allowed = atol + rtol * np.abs(want) + 1.2 * (k + 2) * COMPUTE_EPS[dtype] * scale
    allowed += 1.13 * product_rounding(got, x64 @ w64.T, dtype)
    g = to_float64(got)
    bad = ~(np.abs(g - want) <= allowed)
    assert not bad.any(), f"{bad.sum()} of {bad.size} off: got {g[bad][:5]}, want {want[bad][:5]}"
    return got


def arrays(rng, m, n, k, framework, dtype, bias=True, lead=()):
    x = to_framework(random(rng, lead + (m, k), dtype), framework, dtype)
    w = to_framework(random(rng, (n, k), dtype) / math.sqrt(max(k, 1)), framework, dtype)
    b = to_framework(random(rng, (n,), dtype), framework, dtype) if bias else None
    return x, w, b


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy"], FLOAT_DTYPES) + cases(["torch"], ["bfloat16"]))
def test_shapes(simd_target, rng, framework, dtype, shape):
    check(*arrays(rng, *shape, framework, dtype), framework, dtype, act="gelu")


@pytest.mark.parametrize("shape", [(3, 40, 65), (33, 70, 300), (70, 33, 9)], ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_acts(simd_target, rng, dtype, act, bias, shape):
    check(*arrays(rng, *shape, "numpy", dtype, bias), "numpy", dtype, act=act)


@pytest.mark.parametrize("framework, dtype", cases(["torch", "jax"], FLOAT_DTYPES))
def test_frameworks(rng, framework, dtype):
    check(*arrays(rng, 9, 20, 33, framework, dtype, lead=(2,)), framework, dtype, act="silu")


@pytest.mark.parametrize("act", ACTS)
def test_matches_torch(rng, act):
    x, w, b = arrays(rng, 37, 50, 70, "torch", "float64")
    want = linear_act_reference.torch(x, w, b, act)
    torch.testing.assert_close(opforge.linear_act(x, w, b, act=act), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("lead", [(0,), (2, 0), (3,), (2, 3), (1, 1, 5)], ids=str)
def test_leading_dims(simd_target, rng, lead):
    # Empty batches give empty results; any number of leading dims maps like rows.
    check(*arrays(rng, lead[-1], 12, 20, "numpy", "float32", lead=lead[:-1]), "numpy", "float32", act="relu")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_empty_k_and_n(simd_target, rng, dtype):
    # k = 0: every sum is empty, so the result is act(bias); n = 0: no columns.
    x, w, b = arrays(rng, 4, 5, 0, "numpy", dtype)
    got = check(x, w, b, "numpy", dtype, act="silu")
    np.testing.assert_allclose(got[2].astype(np.float64), activate(b.astype(np.float64), "silu"), rtol=1e-3)
    check(*arrays(rng, 4, 0, 3, "numpy", dtype), "numpy", dtype, act="gelu")


STRIDED = [(f, kind, d) for f in ("numpy", "torch") for kind in STRIDED_KINDS[f] for d in ("float32", "bfloat16")
           if has_dtype(f, d)]


@pytest.mark.parametrize("framework, kind, dtype", STRIDED)
@pytest.mark.parametrize("shape", [(5, 40, 33), (40, 70, 33)], ids=str)
def test_strided(simd_target, rng, framework, kind, dtype, shape):
    # Strided x, strided (e.g. transposed: weight.t() of a [k, n] matrix) weight, strided bias.
    m, n, k = shape
    x, w, b = arrays(rng, m, n, k, framework, dtype)
    check(strided(rng, (m, k), framework, dtype, kind)[0], w, b, framework, dtype, act="gelu")
    check(x, strided(rng, (n, k), framework, dtype, kind)[0], b, framework, dtype, act="gelu")
    if kind != "transposed":  # a transposed vector is the vector
        check(x, w, strided(rng, (n,), framework, dtype, kind)[0], framework, dtype, act="gelu")


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_leading_dims_that_do_not_collapse(simd_target, rng, framework):
    # x[:, ::2] of a [4, 7, k] array: rows are not evenly spaced, so they are gathered first.
    base = to_framework(random(rng, (4, 7, 33), "float32"), framework, "float32")
    _, w, b = arrays(rng, 1, 20, 33, framework, "float32")
    check(base[:, ::2], w, b, framework, "float32", act="gelu")


# The fused epilogue is the activation op, bit for bit, on the product act="none" returns (float32
# and float64: no rounding in between). Pre-activations of standard deviation ~4 put lanes inside
# and outside the CPU activations' tables in most vectors; 67 columns leave a row's tail.
@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_epilogue_is_the_activation_op(simd_target, rng, dtype, act):
    x, w, b = arrays(rng, 30, 67, 48, "numpy", dtype)
    w = w * 4
    z = opforge.linear_act(x, w, b, act="none")
    if act == "gelu_tanh":
        want = opforge.gelu(z, approximate="tanh")
    else:
        want = getattr(opforge, act)(z)
    np.testing.assert_array_equal(opforge.linear_act(x, w, b, act=act), want)


@pytest.fixture
def restore_threads():
    before = opforge.num_threads()
    yield
    opforge.set_num_threads(before)


@pytest.mark.parametrize("shape", [(300, 260, 520), (2, 1000, 300), (1000, 3, 64)], ids=str)
def test_deterministic_across_thread_counts(rng, restore_threads, shape):
    x, w, b = arrays(rng, *shape, "torch", "float32")
    results = []
    for threads in (1, 2, 3, 1):
        opforge.set_num_threads(threads)
        results.append(opforge.linear_act(x, w, b, act="gelu"))
    assert all(torch.equal(r, results[0]) for r in results[1:])
    check(x, w, b, "torch", "float32", act="gelu")


# The bfloat16 units' paths (AMX, AVX512_BF16's dot products, FMA): x packed (fewer rows) or weight
# packed; k = 513 and 1030 end in a partial tile (AMX) or K block inside a second K block, 513 and
# 1 are odd (no pairs: the FMA product); 600 packed rows span two P ranges; odd rows everywhere.
@pytest.mark.parametrize("shape", [(33, 65, 513), (600, 70, 1030), (700, 600, 64), (40, 7000, 40), (17, 40, 1),
                                   (70, 33, 900)], ids=str)
@pytest.mark.parametrize("act", ["none", "gelu"])
def test_bf16_unit_shapes(bf16_unit, rng, shape, act):
    check(*arrays(rng, *shape, "torch", "bfloat16"), "torch", "bfloat16", act=act)


# Transposed x or weight (rows side by side): with AVX512_BF16, made into rows of pairs first
# (16 x 16 squares: whole ones, and rows and pairs past the last).
@pytest.mark.parametrize("operands", ["x", "weight", "both"])
@pytest.mark.parametrize("shape", [(40, 70, 34), (100, 50, 66), (33, 300, 260)], ids=str)
def test_bf16_unit_transposed(bf16_unit, rng, shape, operands):
    m, n, k = shape
    x, w, b = arrays(rng, m, n, k, "torch", "bfloat16")
    if operands in ("x", "both"):
        x = x.T.contiguous().T
    if operands in ("weight", "both"):
        w = w.T.contiguous().T
    check(x, w, b, "torch", "bfloat16", act="gelu")


def test_bf16_unit_preact_and_gradients_agree(bf16_unit, rng):
    # The saving forward (used when a gradient will be needed) takes the same product.
    x, w, b = arrays(rng, 70, 90, 100, "torch", "bfloat16")
    want = opforge.linear_act(x, w, b, act="silu")
    got = opforge.torch.linear_act(x.requires_grad_(), w, b, act="silu")
    assert torch.equal(got.detach(), want)
    got.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()


def test_bf16_unit_deterministic_across_thread_counts(bf16_unit, rng, restore_threads):
    x, w, b = arrays(rng, 300, 260, 520, "torch", "bfloat16")
    results = []
    for threads in (1, 2, 3, 1):
        opforge.set_num_threads(threads)
        results.append(opforge.linear_act(x, w, b, act="gelu"))
    assert all(torch.equal(r, results[0]) for r in results[1:])


def test_bf16_unit_flushes_denormals(bf16_unit):
    # The tiles' and vdpbf16ps's arithmetic treat denormal inputs as zero (as oneDNN's products on
    # them do); the FMA path keeps them. 2**-130 is a bfloat16 denormal; 2**-130 * 2**100 * 64 = 2**-24.
    x = torch.full((64, 64), 2.0**-130, dtype=torch.bfloat16)
    w = torch.full((64, 64), 2.0**100, dtype=torch.bfloat16)
    got = opforge.linear_act(x, w)
    assert torch.equal(got, torch.full_like(got, 2.0**-24 if bf16_unit == "fma" else 0.0))


def test_amx_switch():
    before = opforge.amx_enabled()
    try:
        opforge.set_amx_enabled(False)
        assert not opforge.amx_enabled() and opforge.info()["amx"] == {"supported": opforge.amx_supported(),
                                                                          "enabled": False}
        opforge.set_amx_enabled(True)
        assert opforge.amx_enabled() == opforge.amx_supported()
    finally:
        opforge.set_amx_enabled(before)


X = np.ones((2, 3), np.float32)
W = np.ones((4, 3), np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.linear_act(X, W, act="tanh"), ValueError,
     r"linear_act\(\): 'act' must be one of 'none', 'relu', 'gelu', 'gelu_tanh', 'silu', got 'tanh'"),
    (lambda: opforge.linear_act(X, np.ones((4, 2), np.float32)), ValueError,
     r"linear_act\(\): 'weight' must have shape \[n, 3\] \(k = x.shape\[-1\] = 3\), got \[4, 2\]"),
    (lambda: opforge.linear_act(X, W, np.ones(3, np.float32)), ValueError,
     r"linear_act\(\): 'bias' must have shape \[4\], got \[3\]"),
    (lambda: opforge.linear_act(X, W.reshape(2, 2, 3)), ValueError,
     r"linear_act\(\): 'weight' must have rank 2, got rank 3"),
    (lambda: opforge.linear_act(X, W, np.ones((1, 4), np.float32)), ValueError,
     r"linear_act\(\): 'bias' must have rank 1, got rank 2"),
    (lambda: opforge.linear_act(X[0, 0], W), ValueError, r"linear_act\(\): 'x' must have rank >= 1, got rank 0"),
    (lambda: opforge.linear_act(X, W.astype(np.float64)), TypeError,
     r"linear_act\(\): 'weight' must have dtype float32 like 'x', got float64"),
    (lambda: opforge.linear_act(X, W, np.ones(4, np.float16)), TypeError,
     r"linear_act\(\): 'bias' must have dtype float32 like 'x', got float16"),
    (lambda: opforge.linear_act(X.astype(np.int32), W.astype(np.int32)), TypeError,
     r"linear_act\(\): 'x' must have dtype in \[float32, float64, float16, bfloat16\], got int32"),
    (lambda: opforge.linear_act(X, W, act=1), TypeError, r"linear_act\(\): 'act' must be a str, got int"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_reference_flops():
    x, w, b = np.ones((2, 3, 5)), np.ones((7, 5)), np.ones(7)
    assert linear_act_reference.flops([x, w, b]) == 2 * 6 * 7 * 5
