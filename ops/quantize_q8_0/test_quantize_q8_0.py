"""quantize_q8_0 byte for byte against a NumPy transcription of ggml's quantize_row_q8_0_ref,
and its round trip through dequantize within the format's error bound."""

import numpy as np
import pytest

import opforge
from opforge.references.quantize_q8_0 import numpy as ggml_q8_0  # ggml's quantizer in NumPy
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
    got = opforge.quantize_q8_0(x)
    want = ggml_q8_0(to_float64(x).astype(np.float32))  # half inputs widen to float32 exactly
    g = got.numpy() if framework == "torch" else np.asarray(got)
    assert g.dtype == np.uint8 and g.shape == want.shape
    np.testing.assert_array_equal(g, want)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch", "jax"], DTYPES))
def test_bytes_match_ggml(simd_target, rng, framework, dtype, shape):
    check(to_framework(data(rng, shape), framework, dtype), framework)


def test_rounding_ties_and_zero_blocks(simd_target):
    # Block 0: amax 127 makes d = 1 and id = 1, so x = j + 0.5 are exact ties: roundf goes away
    # from zero (np.round would go to even). Block 1 is all zeros (d = 0, id = 0), block 2 -0.0.
    ties = np.concatenate([np.arange(-15.5, 15.5, 1.0), [127.0]])
    x = np.concatenate([ties, np.zeros(32), -np.zeros(32)]).astype(np.float32)
    got = opforge.quantize_q8_0(x)
    np.testing.assert_array_equal(got, ggml_q8_0(x))
    q = got[2:34].view(np.int8)
    assert list(q[[0, 15, 16, 17]]) == [-16, -1, 1, 2]  # -15.5, -0.5, 0.5, 1.5
    assert not got[34:].any()


def test_rounding_next_to_ties(simd_target):
    # The floats on either side of n + 0.5 with id = 1 (amax 127): the kernel's roundf adds
    # 0.5 - 2^-25 and truncates, which must not round 0.49999997 up to 1, nor any other
    # value across an integer.
    ties = np.arange(0.5, 127.0, 4.0, dtype=np.float32)[:31]
    for toward in (0.0, np.inf):
        x = np.nextafter(ties, np.float32(toward)) * np.where(np.arange(31) % 2, -1, 1).astype(np.float32)
        x = np.concatenate([x, [127.0]]).astype(np.float32)
        got = opforge.quantize_q8_0(x)
        np.testing.assert_array_equal(got, ggml_q8_0(x))
        assert list(got[2:4].view(np.int8)) == ([0, -4] if toward == 0.0 else [1, -5])


def roundf(p):
    t = np.trunc(p)
    return t + np.where(np.abs(p - t) >= 0.5, np.sign(p), 0)


def fragile_values(inv):
    """Float32 x whose quant changes if x * inv is not rounded to float32 before roundf (as an
    FMA contracting x * id - trunc(x * id) would do): exact products just below n + 0.5 that
    round up to it. Found by walking the floats next to each (n + 0.5) / inv."""
    found = []
    for n in range(-100, 100):
        start = np.array([(n + 0.5) / float(inv)], np.float32).view(np.int32)
        xs = (start + np.arange(-64, 64, dtype=np.int32)).view(np.float32)
        found.extend(xs[roundf(xs * inv) != roundf(xs.astype(np.float64) * np.float64(inv))])
    return np.array(found[:31], np.float32)


def test_product_rounded_before_roundf(simd_target, rng):
    blocks, fragile = [], 0
    for _ in range(4):
        amax = np.float32(100 + rng.random())  # d = amax / 127 and id are not powers of two
        xs = fragile_values(np.float32(1) / (amax / np.float32(127)))
        fragile += len(xs)
        fill = rng.uniform(-100, 100, 31 - len(xs))
        blocks.append(np.concatenate([[amax], rng.permutation(np.concatenate([xs, fill]))]))
    assert fragile >= 16
    x = np.concatenate(blocks).astype(np.float32)
    np.testing.assert_array_equal(opforge.quantize_q8_0(x), ggml_q8_0(x))


@pytest.mark.parametrize("framework, kind, dtype", [
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in ("float32", "float16")])
def test_strided(simd_target, rng, framework, kind, dtype):
    x, _ = strided(rng, (5, 64), framework, dtype, kind)
    check(x, framework)


def test_round_trip_within_bound(simd_target, rng):
    # |x - q * dh| <= |x - q * d| + |q| * |d - dh|, d the float32 scale, dh its fp16 rounding.
    # q = roundf(fl(x * fl(1 / d))) is within 0.5 of x / d up to two float32 roundings of a
    # value <= 127 (127 * 2^-23 < 2e-5), so |x - q * d| <= d * (0.5 + 2e-5); dh is within
    # 2^-11 of d, relatively, where fp16 is normal (so the bound is about 0.56 d), and the
    # second term measures it exactly. The dequantized q * dh is exact in float32 (8 + 11
    # significant bits).
    x = data(rng, (16, 4096)).astype(np.float32)
    q = opforge.quantize_q8_0(x)
    back = opforge.dequantize(q, "q8_0").astype(np.float64)
    blocks = q.reshape(16, -1, 34)
    dh = blocks[..., :2].copy().view("<f2")[..., 0].astype(np.float64)
    quants = blocks[..., 2:].view(np.int8).astype(np.float64)
    d = np.abs(x.reshape(16, -1, 32)).max(axis=-1).astype(np.float64) / 127
    bound = d[..., None] * (0.5 + 2e-5) + np.abs(quants) * np.abs(d - dh)[..., None]
    err = np.abs(x.astype(np.float64) - back).reshape(16, -1, 32)
    assert (err <= bound).all(), float((err - bound).max())


def test_jax_jit_and_vmap(rng):
    jax = pytest.importorskip("jax")
    import opforge.jax as oj

    x = data(rng, (4, 3, 96)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(oj.quantize_q8_0)(x)), ggml_q8_0(x))
    batched = jax.jit(jax.vmap(oj.quantize_q8_0))
    np.testing.assert_array_equal(np.asarray(batched(x)), ggml_q8_0(x))
    hlo = batched.lower(x).as_text()
    assert hlo.count("opforge_call") == 1 and "while" not in hlo  # maps over leading dims: one call


def test_torch_adapter(rng):
    ot = pytest.importorskip("opforge.torch")
    x = torch.from_numpy(data(rng, (3, 64)).astype(np.float32))
    np.testing.assert_array_equal(ot.quantize_q8_0(x).numpy(), ggml_q8_0(x.numpy()))


@pytest.mark.parametrize("call, error, message", [
    (lambda: opforge.quantize_q8_0(np.ones((2, 33), np.float32)), ValueError,
     r"quantize_q8_0\(\): 'x' last dimension must be a multiple of 32, got 33"),
    (lambda: opforge.quantize_q8_0(np.ones(64)), TypeError,
     r"quantize_q8_0\(\): 'x' must have dtype in \[float32, float16, bfloat16\], got float64"),
    (lambda: opforge.quantize_q8_0(np.float32(1)), ValueError,
     r"quantize_q8_0\(\): 'x' must have rank >= 1, got rank 0"),
])
def test_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()
