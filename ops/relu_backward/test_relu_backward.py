"""relu_backward against NumPy float64 and torch autograd of relu, on every float dtype, SIMD
target, layout and broadcast. Its second argument is relu's result; the kernel's rule (grad where
it is > 0) is checked on any values, relu's results among them."""

import numpy as np
import pytest

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, assert_close, assert_result, cases, random, strided,
                             to_float64, to_framework)
from opforge.testing import torch  # None without torch: its cases skip, NumPy's still run
from opforge.references import relu as relu_reference

SHAPES = [(), (1,), (7,), (4097,), (0,), (4, 0, 3), (3, 5, 7)]


def reference(g64, x64):
    # As torch's threshold_backward: 0 where x <= 0 (x = 0 included), grad elsewhere (x NaN too).
    return np.where(x64 <= 0, 0.0, g64)


def torch_grad(g64, x64):
    x = torch.from_numpy(x64).requires_grad_()
    relu_reference.torch(x).backward(torch.from_numpy(g64))
    return x.grad.numpy()


def check(grad, x, framework, dtype):
    g64, x64 = to_float64(grad), to_float64(x)
    want = reference(*np.broadcast_arrays(g64, x64))
    got = opforge.relu_backward(grad, x)
    assert_result(got, framework, dtype, want.shape)
    assert_close(got, want, dtype)


def pair(rng, shape, framework, dtype):
    x64 = random(rng, shape, dtype)
    x64.reshape(-1)[::5] = 0  # relu's kink: the gradient there is 0
    return to_framework(random(rng, shape, dtype), framework, dtype), to_framework(x64, framework, dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_shapes(simd_target, rng, framework, dtype, shape):
    check(*pair(rng, shape, framework, dtype), framework, dtype)


@pytest.mark.parametrize("shape", [(7,), (4, 33)], ids=str)
def test_matches_torch_autograd(rng, shape):
    grad, x = pair(rng, shape, "numpy", "float64")
    x.reshape(-1)[1::7] = np.nan
    np.testing.assert_array_equal(opforge.relu_backward(grad, opforge.relu(x)), torch_grad(grad, x))


@pytest.mark.parametrize("grad_shape, x_shape", [((4, 33), (33,)), ((33,), (4, 33)), ((2, 1, 7), (3, 1))], ids=str)
def test_broadcast(simd_target, rng, grad_shape, x_shape):
    # grad and x broadcast, as under jax.vmap with one of them unbatched.
    grad = to_framework(random(rng, grad_shape, "float32"), "torch", "float32")
    x = to_framework(random(rng, x_shape, "float32"), "torch", "float32")
    check(grad, x, "torch", "float32")


@pytest.mark.parametrize("framework, dtype", cases(["jax"], FLOAT_DTYPES))
def test_jax(rng, framework, dtype):
    check(*pair(rng, (3, 33), framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, kind", [(f, k) for f in ("numpy", "torch") for k in STRIDED_KINDS[f]])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_strided(simd_target, rng, framework, kind, dtype):
    shape = (5, 33)
    grad, x = pair(rng, shape, framework, dtype)
    grad_view, x_view = strided(rng, shape, framework, dtype, kind)[0], strided(rng, shape, framework, dtype, kind)[0]
    for g, v in [(grad_view, x), (grad, x_view), (grad_view, x_view)]:
        check(g, v, framework, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_nan_inf(simd_target, framework, dtype):
    x64 = np.resize([np.nan, np.inf, -np.inf, -1.0, 0.5, 0.0, -0.0], 37)
    g64 = np.resize([1.5, -2.0, np.nan, np.inf], 37)
    check(to_framework(g64, framework, dtype), to_framework(x64, framework, dtype), framework, dtype)


def test_declared():
    op = opforge._core.op("relu_backward")
    assert op.backward is None
    assert op.leading_dim_args == ["grad", "result"]
    assert [a["name"] for a in op.args] == ["grad", "result"]  # relu's result, not its input


F32 = np.ones(3, np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.relu_backward(F32, F32.astype(np.float64)), TypeError,
     r"relu_backward\(\): 'result' must have dtype float32 like 'grad', got float64"),
    (lambda: opforge.relu_backward(F32, np.ones(4, np.float32)), ValueError,
     r"relu_backward\(\): 'grad' of shape \[3\] and 'result' of shape \[4\] cannot be broadcast together"),
    (lambda: opforge.relu_backward(F32.astype(np.int32), F32.astype(np.int32)), TypeError,
     r"relu_backward\(\): 'grad' must have dtype in \[float32, float64, float16, bfloat16\], got int32"),
    (lambda: opforge.relu_backward(F32), TypeError, r"relu_backward\(\) missing required argument 'result'"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
