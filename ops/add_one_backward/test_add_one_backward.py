"""add_one_backward against NumPy and torch autograd of add_one, on every float dtype, SIMD target
and layout: the gradient is grad itself, bit for bit, in memory of its own."""

import numpy as np
import pytest
import torch

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, assert_result, cases, has_dtype, random, reference, strided,
                             to_float64, to_framework)
from opforge.testing import rng, simd_target  # noqa: F401  (fixtures, so the file runs outside the checkout too)

add_one_reference = reference("add_one", near=__file__)

SHAPES = [(), (1,), (7,), (33,), (4097,), (0,), (4, 0, 3), (3, 5, 7)]


def torch_grad(g64):
    """Gradient of add_one's torch reference by autograd, in float64."""
    x = torch.from_numpy(np.zeros_like(g64)).requires_grad_()
    add_one_reference.torch(x).backward(torch.from_numpy(g64))
    return x.grad.numpy()


def check(grad, framework, dtype):
    g64 = to_float64(grad)
    got = opforge.add_one_backward(grad)
    assert_result(got, framework, dtype, g64.shape)
    # A copy is exact in every dtype: both references must match to the bit (NaN to NaN).
    np.testing.assert_array_equal(to_float64(got), g64.copy())
    np.testing.assert_array_equal(to_float64(got), torch_grad(g64))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_shapes(simd_target, rng, framework, dtype, shape):
    check(to_framework(random(rng, shape, dtype), framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, dtype", cases(["jax"], FLOAT_DTYPES))
def test_jax(simd_target, rng, framework, dtype):
    check(to_framework(random(rng, (3, 33), dtype), framework, dtype), framework, dtype)


@pytest.mark.parametrize("framework, kind, dtype", [
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in FLOAT_DTYPES if has_dtype(f, d)])
@pytest.mark.parametrize("shape", [(33,), (5, 33), (2, 3, 7)], ids=str)
def test_strided(simd_target, rng, framework, kind, dtype, shape):
    grad, _ = strided(rng, shape, framework, dtype, kind)
    check(grad, framework, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_bits_survive(simd_target, dtype):
    # Half types pass through float32 lanes; the round trip must keep every bit of finite
    # values (subnormals, -0.0) and infinities, in the SIMD body and the scalar tail alike.
    bits = {"float64": 64, "float32": 32, "float16": 16, "bfloat16": 16}[dtype]
    tdtype = getattr(torch, dtype)
    ints = torch.randint(-(1 << (bits - 1)), (1 << (bits - 1)) - 1, (4099,), dtype=getattr(torch, f"int{bits}"))
    grad = ints.view(tdtype)
    grad = torch.where(torch.isnan(grad), torch.zeros_like(grad), grad)  # NaN payloads may be quieted
    grad[:3] = torch.tensor([0.0, -0.0, float("inf")], dtype=tdtype)
    got = opforge.add_one_backward(grad)
    assert torch.equal(got.view(ints.dtype), grad.view(ints.dtype))
    assert torch.isnan(opforge.add_one_backward(torch.full((37,), float("nan"), dtype=tdtype))).all()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_large_and_deterministic(simd_target, rng, dtype):
    grad = to_framework(random(rng, (1 << 20,), dtype), "torch", dtype)
    before = opforge.num_threads()
    try:
        results = []
        for threads in (1, 2):
            opforge.set_num_threads(threads)
            results.append(opforge.add_one_backward(grad))
    finally:
        opforge.set_num_threads(before)
    assert torch.equal(results[0], grad) and torch.equal(results[1], grad)


def test_result_is_fresh(rng):
    grad = rng.standard_normal(33)
    before = grad.copy()
    got = opforge.add_one_backward(grad)
    got[:] = 0
    np.testing.assert_array_equal(grad, before)


def test_declared_as_add_one_gradient():
    assert opforge._core.op("add_one").backward == ("add_one_backward", ["x"])


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.add_one_backward(np.ones(3, np.int32)), TypeError,
     r"add_one_backward\(\): 'grad' must have dtype in \[float32, float64, float16, bfloat16\], got int32"),
    (lambda: opforge.add_one_backward(), TypeError, r"add_one_backward\(\) missing required argument 'grad'"),
    (lambda: opforge.add_one_backward(1.0), TypeError, r"add_one_backward\(\): 'grad' must be an array .*got float"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
