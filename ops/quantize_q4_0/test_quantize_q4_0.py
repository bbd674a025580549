"""quantize_q4_0 byte for byte against a NumPy transcription of ggml's quantize_row_q4_0_ref,
and its round trip through dequantize within the format's error bound."""

import numpy as np
import pytest

import opforge
from opforge.references.quantize_q4_0 import numpy as ggml_q4_0  # ggml's quantizer in NumPy
from opforge.testing import STRIDED_KINDS, cases, strided, to_float64, to_framework
from opforge.testing import torch  # None without torch: its cases skip, NumPy's still run

DTYPES = ("float32", "float16", "bfloat16")
SHAPES = [(32,), (1, 32), (7, 96), (2, 3, 64), (3, 4096), (0, 64), (4, 0)]


def data(rng, shape):
    """Normal values with block scales spread over 1e-3..1e3, so the fp16 scales vary widely."""
    x = rng.standard_normal(shape)
    if x.size:
        blocks = x.reshape(-1, 32)
        blocks *= 10.0 ** rng.uniform(-3, 3, (blocks.shape[0], 1))
    return x


def check(x, framework):
    got = opforge.quantize_q4_0(x)
    want = ggml_q4_0(to_float64(x).astype(np.float32))  # half inputs widen to float32 exactly
    g = got.numpy() if framework == "torch" else np.asarray(got)
    assert g.dtype == np.uint8 and g.shape == want.shape
    np.testing.assert_array_equal(g, want)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch", "jax"], DTYPES))
def test_bytes_match_ggml(simd_target, rng, framework, dtype, shape):
    check(to_framework(data(rng, shape), framework, dtype), framework)


def test_ties_sign_and_zero_blocks(simd_target):
    # Block 0: max -8 makes d = 1 and id = 1, so half-integers land exactly on x + 8.5 and
    # truncate: q - 8 rounds half up. Blocks 1 and 2 hold +3 and -3 in both orders: the first
    # sets the sign of d. Block 3 is all zeros: d = +0 / -8 = -0 (bytes 00 80).
    ties = np.concatenate([[-8.0], np.arange(-7.5, 8.0, 0.5)])
    pair = np.zeros(32)
    pair[[5, 9]] = [3.0, -3.0]
    x = np.concatenate([ties, pair, -pair, np.zeros(32)]).astype(np.float32)
    got = opforge.quantize_q4_0(x)
    np.testing.assert_array_equal(got, ggml_q4_0(x))
    scales = got.reshape(4, 18)[:, :2].copy().view("<f2")[:, 0]
    np.testing.assert_array_equal(scales, np.array([1.0, -0.375, 0.375, -0.0], np.float16))
    assert np.signbit(scales[3])
    q = opforge.dequantize(got[:18], "q4_0")
    np.testing.assert_array_equal(q, np.concatenate([[-8.0], np.floor(np.arange(-7.5, 8.0, 0.5) + 0.5)]).clip(-8, 7))


def test_ties_and_zero_blocks_anywhere_in_a_group(simd_target, rng):
    # The kernel finds each block's signed maximum 16 blocks at a time and searches a block only
    # when +a and -a both reach its largest magnitude: such blocks, all-zero blocks of either
    # sign and ordinary ones, shuffled so that every position in a group sees each kind.
    blocks = []
    for kind in rng.permutation(np.repeat(np.arange(6), 20)):
        b = rng.uniform(-1, 1, 32)
        a = rng.uniform(0.5, 2)
        if kind == 0:  # +a first, -a later
            i, j = np.sort(rng.choice(32, 2, replace=False))
            b[[i, j]] = [a, -a]
        elif kind == 1:  # -a first, +a later
            i, j = np.sort(rng.choice(32, 2, replace=False))
            b[[i, j]] = [-a, a]
        elif kind == 2:  # zeros of both signs
            b = np.where(rng.random(32) < 0.5, -0.0, 0.0)
        elif kind == 3:  # all -0
            b = np.full(32, -0.0)
        elif kind == 4:  # a repeated magnitude of one sign only
            b[rng.choice(32, 3, replace=False)] = -a
        blocks.append(b)
    x = np.concatenate(blocks).astype(np.float32)
    got = opforge.quantize_q4_0(x)
    np.testing.assert_array_equal(got, ggml_q4_0(x))
    np.testing.assert_array_equal(opforge.quantize_q4_0(x[: 32 * 37]), ggml_q4_0(x[: 32 * 37]))  # a short last group


def fragile_values(inv):
    """Float32 x whose quant changes if x * inv + 8.5 were computed with one rounding (an FMA)
    instead of ggml's two. Found by walking the floats next to each (n - 8.5) / inv."""
    found = []
    for n in range(1, 16):
        start = np.array([(n - 8.5) / float(inv)], np.float32).view(np.int32)
        xs = (start + np.arange(-2048, 2048, dtype=np.int32)).view(np.float32)
        two = np.trunc(xs * inv + np.float32(8.5))
        fused = np.trunc((xs.astype(np.float64) * np.float64(inv) + 8.5).astype(np.float32))
        found.extend(xs[two != fused])
    return np.array(found[:31], np.float32)


def test_product_rounded_before_sum(simd_target, rng):
    blocks, fragile = [], 0
    for _ in range(8):
        mx = np.float32(-(6.5 + rng.random()))  # the block's max: d = mx / -8, id not a power of 2
        xs = fragile_values(np.float32(1) / (mx / np.float32(-8)))
        fragile += len(xs)
        fill = rng.uniform(-6, 6, 31 - len(xs))
        blocks.append(np.concatenate([[mx], rng.permutation(np.concatenate([xs, fill]))]))
    assert fragile >= 16
    x = np.concatenate(blocks).astype(np.float32)
    np.testing.assert_array_equal(opforge.quantize_q4_0(x), ggml_q4_0(x))


@pytest.mark.parametrize("framework, kind, dtype", [
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in ("float32", "float16")])
def test_strided(simd_target, rng, framework, kind, dtype):
    x, _ = strided(rng, (5, 64), framework, dtype, kind)
    check(x, framework)


def test_round_trip_within_bound(simd_target, rng):
    # p = fl(x * fl(1 / d)) is within 3 * 2^-24 * 8 of x / d, which lies in [-8, 8]. Below the
    # clamp, q - 8 = trunc(fl(p + 8.5)) - 8 rounds p half up, off by at most 0.5 plus the sum's
    # rounding (2^-20 below 16): |x - (q - 8) * d| <= |d| * (0.5 + 2e-6). The clamp q = 15 takes
    # p in [6.5, 8] to 7: off by at most 1, so there the bound is |d|. Storing dh (fp16) for d
    # adds |q - 8| * |d - dh|. The dequantized (q - 8) * dh is exact in float32.
    x = data(rng, (16, 4096)).astype(np.float32)
    q = opforge.quantize_q4_0(x)
    back = opforge.dequantize(q, "q4_0").astype(np.float64)
    blocks = q.reshape(16, -1, 18)
    dh = blocks[..., :2].copy().view("<f2")[..., 0].astype(np.float64)
    nib = blocks[..., 2:].astype(np.int64)
    quants = np.concatenate([nib & 15, nib >> 4], axis=-1)
    d = np.abs(x.reshape(16, -1, 32)).max(axis=-1).astype(np.float64) / 8
    step = np.where(quants == 15, 1.0, 0.5 + 2e-6)
    bound = d[..., None] * step * (1 + 1e-6) + np.abs(quants - 8) * np.abs(d - np.abs(dh))[..., None]
    err = np.abs(x.astype(np.float64) - back).reshape(16, -1, 32)
    assert (err <= bound).all(), float((err - bound).max())


def test_jax_jit_and_vmap(rng):
    jax = pytest.importorskip("jax")
    import opforge.jax as oj

    x = data(rng, (4, 3, 96)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(oj.quantize_q4_0)(x)), ggml_q4_0(x))
    batched = jax.jit(jax.vmap(oj.quantize_q4_0))
    np.testing.assert_array_equal(np.asarray(batched(x)), ggml_q4_0(x))
    hlo = batched.lower(x).as_text()
    assert hlo.count("opforge_call") == 1 and "while" not in hlo  # maps over leading dims: one call


def test_torch_adapter(rng):
    ot = pytest.importorskip("opforge.torch")
    x = torch.from_numpy(data(rng, (3, 64)).astype(np.float32))
    np.testing.assert_array_equal(ot.quantize_q4_0(x).numpy(), ggml_q4_0(x.numpy()))


@pytest.mark.parametrize("call, error, message", [
    (lambda: opforge.quantize_q4_0(np.ones((2, 48), np.float32)), ValueError,
     r"quantize_q4_0\(\): 'x' last dimension must be a multiple of 32, got 48"),
    (lambda: opforge.quantize_q4_0(np.ones(64, np.int32)), TypeError,
     r"quantize_q4_0\(\): 'x' must have dtype in \[float32, float16, bfloat16\], got int32"),
    (lambda: opforge.quantize_q4_0(np.float32(1)), ValueError,
     r"quantize_q4_0\(\): 'x' must have rank >= 1, got rank 0"),
])
def test_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()
