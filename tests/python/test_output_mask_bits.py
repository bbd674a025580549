"""A backward op asked for some of its results gives them with the full call's bits, on every SIMD
target and every row length's split between vector loops and single elements. (An output mask
compiles to another instantiation of the kernel: GCC once fused a*b+c in one and not the other,
and rms_norm_backward's grad_weight differed in the last bits on AVX2.) NumPy only, so the emulated
Arm run (scripts/test.sh) runs it too; test_output_mask.py has the torch frontends."""

import numpy as np
import pytest

import opforge
from opforge.testing import random, rng, simd_target, to_framework  # noqa: F401 (fixtures)

# Every tail of an AVX-512 float32 vector (16 lanes) and of two, a wide row, and a shape whose
# grad_x (8 MB in float32) goes out through non-temporal stores, whose row starts are single elements.
ROW_LENGTHS = list(range(1, 36)) + [257]
OPS = ["rms_norm_backward", "layer_norm_backward"]


def inputs(rng, dtype, rows, n):
    return [to_framework(random(rng, shape, dtype), "numpy", dtype) for shape in [(rows, n), (rows, n), (n,)]]


def expect_masks_keep_the_bits(name, args):
    op = getattr(opforge, name)
    results = op.op.num_results
    full = op(*args, eps=1e-5)
    for mask in range(1, 1 << results):
        got = op(*args, eps=1e-5, output_mask=mask)
        for i in range(results):
            if mask >> i & 1:
                np.testing.assert_array_equal(got[i], full[i], err_msg=f"{name} mask {mask:b}, result {i}")


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("name", OPS)
def test_every_mask_keeps_the_bits_at_every_row_length(simd_target, rng, name, dtype):
    for n in ROW_LENGTHS:
        expect_masks_keep_the_bits(name, inputs(rng, dtype, 5, n))


@pytest.mark.parametrize("name", OPS)
def test_every_mask_keeps_the_bits_when_grad_x_streams(rng, name):
    expect_masks_keep_the_bits(name, inputs(rng, "float32", 520, 4099))
