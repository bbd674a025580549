"""dequantize against NumPy's float32 products of ggml's blocks, on random bytes: every fp16
scale pattern (subnormal, inf, NaN included) and every quant."""

import numpy as np
import pytest
import torch

import opforge
from opforge.references.dequantize import numpy as ggml_dequantize  # ggml's dequantize_row_* in NumPy

BYTES = {"q8_0": 34, "q4_0": 18}
SHAPES = [(1,), (7, 3), (2, 3, 5), (4, 128), (0, 2), (3, 0)]  # in blocks


def random_blocks(rng, shape, fmt):
    """uint8 of `shape` blocks: uniformly random bytes, so scales are arbitrary fp16 bit patterns."""
    return rng.integers(0, 256, tuple(shape[:-1]) + (shape[-1] * BYTES[fmt],), dtype=np.uint8)


@pytest.mark.parametrize("fmt", BYTES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework", ["numpy", "torch", "jax"])
def test_matches_ggml(simd_target, rng, framework, shape, fmt):
    q = random_blocks(rng, shape, fmt)
    arg = {"numpy": lambda a: a, "torch": torch.from_numpy, "jax": lambda a: __import__("jax").numpy.asarray(a)}
    got = opforge.dequantize(arg[framework](q), fmt)
    g = got.numpy() if framework == "torch" else np.asarray(got)
    assert g.dtype == np.float32
    np.testing.assert_array_equal(g, ggml_dequantize(q, fmt))  # NaN meets NaN


@pytest.mark.parametrize("fmt", BYTES)
@pytest.mark.parametrize("kind", ["column_major", "row_step", "inner_step", "reversed", "broadcast"])
def test_strided(simd_target, rng, fmt, kind):
    base = random_blocks(rng, (6, 6), fmt)
    view = {"column_major": np.asfortranarray(base), "row_step": base[1::2], "inner_step": base[:, ::2],
            "reversed": base[::-1, ::-1], "broadcast": np.broadcast_to(base[:1], base.shape)}[kind]
    np.testing.assert_array_equal(opforge.dequantize(view, fmt), ggml_dequantize(view, fmt))


def test_jax_jit_and_vmap(rng):
    jax = pytest.importorskip("jax")
    import opforge.jax as oj

    q = random_blocks(rng, (4, 3, 2), "q4_0")
    f = jax.jit(lambda a: oj.dequantize(a, "q4_0"))
    np.testing.assert_array_equal(np.asarray(f(q)), ggml_dequantize(q, "q4_0"))
    batched = jax.jit(jax.vmap(lambda a: oj.dequantize(a, "q4_0")))
    np.testing.assert_array_equal(np.asarray(batched(q)), ggml_dequantize(q, "q4_0"))
    assert batched.lower(q).as_text().count("opforge_call") == 1


def test_torch_adapter(rng):
    ot = pytest.importorskip("opforge.torch")
    q = random_blocks(rng, (3, 2), "q8_0")
    np.testing.assert_array_equal(ot.dequantize(torch.from_numpy(q), "q8_0").numpy(), ggml_dequantize(q, "q8_0"))


@pytest.mark.parametrize("call, error, message", [
    (lambda: opforge.dequantize(np.zeros((2, 35), np.uint8), "q8_0"), ValueError,
     r"dequantize\(\): 'q' last dimension must be a multiple of 34 \(bytes per q8_0 block\), got 35"),
    (lambda: opforge.dequantize(np.zeros(34, np.uint8), "q4_0"), ValueError,
     r"dequantize\(\): 'q' last dimension must be a multiple of 18 \(bytes per q4_0 block\), got 34"),
    (lambda: opforge.dequantize(np.zeros(34, np.int8), "q8_0"), TypeError,
     r"dequantize\(\): 'q' must have dtype uint8, got int8"),
    (lambda: opforge.dequantize(np.zeros(34, np.uint8), "q5_0"), ValueError,
     r"dequantize\(\): 'format' must be 'q8_0' or 'q4_0', got 'q5_0'"),
    (lambda: opforge.dequantize(np.zeros(34, np.uint8), 8), TypeError,
     r"dequantize\(\): 'format' must be a str, got int"),
    (lambda: opforge.dequantize(np.zeros(34, np.uint8)), TypeError,
     r"dequantize\(\) missing required argument 'format'"),
])
def test_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()
