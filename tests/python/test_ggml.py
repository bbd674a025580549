"""opforge's ggml-format ops against ggml's own C library (opforge.ggml_cpu: the copy the
pywhispercpp wheel ships, or OPFORGE_GGML_LIB_DIR): the quantizers' bytes, the dequantizer's
values and matmul_q's products. Skipped where no ggml is found."""

import numpy as np
import pytest
import torch

import opforge
from opforge import ggml_cpu

GGML = ggml_cpu.load()
pytestmark = pytest.mark.skipif(GGML is None, reason="no ggml library (pip install pywhispercpp)")
FORMATS = ["q8_0", "q4_0"]
QUANTIZE = {"q8_0": opforge.quantize_q8_0, "q4_0": opforge.quantize_q4_0}


def awkward_rows(rng, rows, k):
    """Normal rows of every magnitude, with blocks ggml's rounding has to get right: all zeros,
    one value, ties of the largest magnitude in both signs, huge and tiny values, halves."""
    x = rng.standard_normal((rows, k)) * 10.0 ** rng.uniform(-6, 6, (rows, 1))
    x[0, :32] = 0.0
    x[1, :32] = 0.0
    x[1, 5] = -3.0
    x[2, :32] = rng.choice([-1.0, 1.0], 32) * 7.0  # |max| ties: ggml keeps the first
    x[3, :32] = np.arange(32) - 15.5  # q4_0's scale is -max / 8: values on the halves
    x[4, :32] = 1e30 * rng.standard_normal(32)
    x[5, :32] = 1e-30 * rng.standard_normal(32)
    return x.astype(np.float32)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_quantized_bytes_are_ggml_bytes(rng, fmt, dtype):
    x = torch.from_numpy(awkward_rows(rng, 300, 4096)).to(getattr(torch, dtype))
    if dtype == "float16":  # ggml reads float32: the same values
        x = torch.nan_to_num(x, posinf=65504.0, neginf=-65504.0)
    got = QUANTIZE[fmt](x).numpy()
    want = GGML.quantize(x.float().numpy(), fmt)
    mismatched = np.argwhere(got != want)
    assert mismatched.size == 0, f"{len(mismatched)} bytes differ, first at (row, byte) {mismatched[0]}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantized_values_are_ggml_values(rng, fmt):
    q = GGML.quantize(awkward_rows(rng, 64, 1024), fmt)
    np.testing.assert_array_equal(opforge.dequantize(q, fmt), GGML.dequantize(q, fmt))


def on_grid(rng, rows, k):
    """Activations that Q8_0 holds exactly (each block: integers up to +-127, 127 present, times
    a power of two), so opforge and ggml quantize them to the same bytes whatever their rounding
    of halves (ggml's vector code rounds them to even, its reference code away from zero)."""
    q = rng.integers(-127, 128, (rows, k // 32, 32)).astype(np.float64)
    q[..., 0] = 127.0
    return (q * 2.0 ** rng.integers(-10, 10, (rows, k // 32, 1))).reshape(rows, k).astype(np.float32)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 7, 32])
def test_matmul_q_matches_ggml_mul_mat(rng, fmt, rows):
    n, k = 67, 1024
    w = QUANTIZE[fmt](rng.standard_normal((n, k)).astype(np.float32))
    x = on_grid(rng, rows, k)
    got = opforge.matmul_q(x, w, fmt)
    with GGML.matmul(w, fmt, rows) as mm:
        want = mm(x).copy()
    # Both compute the same exact block products; ggml sums them in float32 (opforge in double),
    # so allow float32 sums' rounding over 32 blocks, relative to the terms' sizes.
    terms = np.abs(x) @ np.abs(opforge.dequantize(w, fmt)).T
    assert (np.abs(got - want) <= 2.0**-24 * 16 * terms).all()
    assert np.abs(got).max() > 0


def test_off_grid_activations_differ_at_most_by_their_quantization(rng):
    """Random activations: ggml's vector quantizer may round a half the other way than its
    reference (and opforge), one quant step in a block; otherwise the same products."""
    n, k = 33, 2048
    w = opforge.quantize_q8_0(rng.standard_normal((n, k)).astype(np.float32))
    x = rng.standard_normal((4, k)).astype(np.float32)
    with GGML.matmul(w, "q8_0", 4) as mm:
        want = mm(x).copy()
    got = opforge.matmul_q(x, w, "q8_0")
    step = np.abs(x).reshape(4, -1, 32).max(-1) / 127  # one quant of each block of x
    bound = step @ np.abs(opforge.dequantize(w, "q8_0")).reshape(n, -1, 32).max(-1).T
    assert (np.abs(got - want) <= bound + 1e-5 * np.abs(want)).all()


def test_bad_arguments_raise_before_ggml_can_abort(rng):
    with pytest.raises(ValueError, match=r"ggml_cpu.quantize: k must be a multiple of 32, got 33"):
        GGML.quantize(np.ones((2, 33), np.float32), "q8_0")
    with pytest.raises(ValueError, match=r"ggml_cpu.dequantize: 'q' rows must be whole q8_0 blocks of 34 bytes, got 18"):
        GGML.dequantize(np.zeros((1, 18), np.uint8), "q8_0")
    with pytest.raises(ValueError, match=r"ggml_cpu.matmul: format must be one of \['q4_0', 'q8_0'\], got 'q5_0'"):
        GGML.matmul(np.zeros((1, 18), np.uint8), "q5_0", 1)
    with pytest.raises(ValueError, match=r"ggml_cpu.matmul: 'w' must have 2 dimensions, got 1"):
        GGML.matmul(np.zeros(18, np.uint8), "q4_0", 1)
    with GGML.matmul(np.zeros((3, 18), np.uint8), "q4_0", 2) as mm:
        with pytest.raises(ValueError, match=r"ggml_cpu.matmul: 'x' must have shape \[2, 32\], got \[1, 32\]"):
            mm(np.ones((1, 32), np.float32))
