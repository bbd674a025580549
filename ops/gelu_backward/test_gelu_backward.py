"""gelu_backward (exact and tanh forms) against NumPy float64, torch autograd of gelu and finite
differences of opforge's gelu, on every float dtype, SIMD target, layout and broadcast."""

import math

import numpy as np
import pytest

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, assert_close, assert_result, cases, random, strided,
                             to_float64, to_framework)
from opforge.testing import torch  # None without torch: its cases skip, NumPy's still run
from opforge.references import gelu as gelu_reference

SHAPES = [(), (1,), (7,), (4097,), (0,), (4, 0, 3), (3, 5, 7)]
FORMS = ["none", "tanh"]
erfc = np.vectorize(math.erfc, otypes=[np.float64])


def derivative(x64, approximate):
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        t = np.tanh(k * (x64 + 0.044715 * x64**3))
        return 0.5 * (1 + t) + 0.5 * x64 * (1 - t * t) * k * (1 + 3 * 0.044715 * x64**2)
    return 0.5 * erfc(-x64 / math.sqrt(2)) + x64 * np.exp(-0.5 * x64 * x64) / math.sqrt(2 * math.pi)


def check(grad, x, framework, dtype, approximate):
    g64, x64 = np.broadcast_arrays(to_float64(grad), to_float64(x))
    want = g64 * derivative(x64, approximate)
    got = opforge.gelu_backward(grad, x, approximate=approximate)
    assert_result(got, framework, dtype, want.shape)
    assert_close(got, want, dtype)


def pair(rng, shape, framework, dtype):
    return [to_framework(random(rng, shape, dtype), framework, dtype) for _ in range(2)]


@pytest.mark.parametrize("approximate", FORMS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_shapes(simd_target, rng, framework, dtype, shape, approximate):
    check(*pair(rng, shape, framework, dtype), framework, dtype, approximate)


@pytest.mark.parametrize("approximate", FORMS)
def test_matches_torch_autograd(rng, approximate):
    g64, x64 = rng.standard_normal((2, 4, 33)) * 3
    x = torch.from_numpy(x64).requires_grad_()
    gelu_reference.torch(x, approximate).backward(torch.from_numpy(g64))
    np.testing.assert_allclose(opforge.gelu_backward(g64, x64, approximate), x.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("approximate", FORMS)
def test_matches_finite_differences(rng, approximate):
    # The backward op is the derivative of opforge's own gelu, in float64.
    x64 = rng.standard_normal(257) * 3
    h = 1e-6
    slope = (opforge.gelu(x64 + h, approximate) - opforge.gelu(x64 - h, approximate)) / (2 * h)
    np.testing.assert_allclose(opforge.gelu_backward(np.ones_like(x64), x64, approximate), slope, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("grad_shape, x_shape", [((4, 33), (33,)), ((33,), (4, 33)), ((2, 1, 7), (3, 1))], ids=str)
def test_broadcast(simd_target, rng, grad_shape, x_shape):
    # grad and x broadcast, as under jax.vmap with one of them unbatched.
    grad = to_framework(random(rng, grad_shape, "float32"), "torch", "float32")
    x = to_framework(random(rng, x_shape, "float32"), "torch", "float32")
    for approximate in FORMS:
        check(grad, x, "torch", "float32", approximate)


@pytest.mark.parametrize("framework, dtype", cases(["jax"], FLOAT_DTYPES))
def test_jax(rng, framework, dtype):
    for approximate in FORMS:
        check(*pair(rng, (3, 33), framework, dtype), framework, dtype, approximate)


@pytest.mark.parametrize("framework, kind", [(f, k) for f in ("numpy", "torch") for k in STRIDED_KINDS[f]])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_strided(simd_target, rng, framework, kind, dtype):
    shape = (5, 33)
    grad, x = pair(rng, shape, framework, dtype)
    grad_view, x_view = strided(rng, shape, framework, dtype, kind)[0], strided(rng, shape, framework, dtype, kind)[0]
    for g, v in [(grad_view, x), (grad, x_view), (grad_view, x_view)]:
        for approximate in FORMS:
            check(g, v, framework, dtype, approximate)


@pytest.mark.parametrize("approximate", FORMS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_wide_range(simd_target, rng, dtype, approximate):
    grad = to_framework(random(rng, 4099, dtype), "torch", dtype)
    x = to_framework(rng.uniform(-60, 60, 4099), "torch", dtype)
    check(grad, x, "torch", dtype, approximate)


@pytest.mark.parametrize("approximate", FORMS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_large_matches_torch(simd_target, rng, dtype, approximate):
    # 1<<18 elements: 16 grains of work, every worker of the thread pool busy (the float64
    # reference runs math.erfc element by element).
    grad, x = pair(rng, (1 << 18,), "torch", dtype)
    got = opforge.gelu_backward(grad, x, approximate)
    check(grad, x, "torch", dtype, approximate)
    torch.testing.assert_close(got, torch.ops.aten.gelu_backward(grad, x, approximate=approximate),
                               rtol=1e-5 if dtype == "float32" else 1e-2, atol=3e-6)


@pytest.mark.parametrize("approximate", FORMS)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_nan_inf(simd_target, framework, dtype, approximate):
    # The limits: 0 at -inf, grad at +inf (torch gives NaN at +inf); NaN stays NaN.
    x64 = np.resize([np.nan, np.inf, -np.inf, -1000.0, 1000.0, 0.0, -1.0], 37)
    g64 = np.resize([1.5, -2.0, 0.25], 37)
    want = g64 * np.where(np.isinf(x64), x64 > 0, derivative(np.nan_to_num(x64, posinf=0, neginf=0), approximate))
    want[np.isnan(x64)] = np.nan
    got = opforge.gelu_backward(to_framework(g64, framework, dtype), to_framework(x64, framework, dtype), approximate)
    assert_close(got, want, dtype)


def test_declared():
    op = opforge._core.op("gelu_backward")
    assert op.backward is None
    assert op.leading_dim_args == ["grad", "x"]


F32 = np.ones(3, np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.gelu_backward(F32, F32, approximate="erf"), ValueError,
     r"gelu_backward\(\): 'approximate' must be 'none' or 'tanh', got 'erf'"),
    (lambda: opforge.gelu_backward(F32, F32.astype(np.float16)), TypeError,
     r"gelu_backward\(\): 'x' must have dtype float32 like 'grad', got float16"),
    (lambda: opforge.gelu_backward(F32, np.ones((2, 4), np.float32)), ValueError,
     r"gelu_backward\(\): 'grad' of shape \[3\] and 'x' of shape \[2, 4\] cannot be broadcast together"),
    (lambda: opforge.gelu_backward(F32), TypeError, r"gelu_backward\(\) missing required argument 'x'"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
