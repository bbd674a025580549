"""matmul_q bit for bit against its integer model in NumPy on every SIMD path (VNNI, AVX2,
scalar), and against dequantize-then-matmul in float64 within the activation quantization's
error bound."""

import numpy as np
import pytest

import opforge

BYTES = {"q8_0": 34, "q4_0": 18}
QUANTIZE = {"q8_0": opforge.quantize_q8_0, "q4_0": opforge.quantize_q4_0}
# (rows m, k, columns n): one row and 32; k of 1, 3, 33 (one past a 32-block chunk) and 128
# blocks; odd n leaving partial tiles of 16 (VNNI) and 8 (AVX2) columns; 70 rows cross a
# 64-row chunk and leave rows past the packed kernel's 4-row step. Up to eight rows take the
# unpacked kernels (each count its own instantiation: 1-8 below, 9 the first packed). Several
# tiles per thread and a partial last one (n = 50, 70): each tile prefetches the next one's
# weight rows.
SHAPES = [(1, 32, 1), (1, 4096, 33), (2, 1056, 17), (2, 64, 40), (32, 4096, 17), (32, 96, 33), (7, 96, 17),
          (70, 64, 5), (3, 1056, 9), (3, 4096, 50), (4, 1056, 70), (5, 224, 70), (6, 1056, 50), (8, 4096, 33),
          (9, 96, 17)]


def decode(q, fmt):
    """Quants (int64 [..., blocks, 32], the signed values) and fp16 scales (float64 [..., blocks])."""
    q = np.ascontiguousarray(q)
    blocks = q.reshape(q.shape[:-1] + (q.shape[-1] // BYTES[fmt], BYTES[fmt]))
    d = blocks[..., :2].copy().view("<f2")[..., 0].astype(np.float64)
    if fmt == "q8_0":
        return blocks[..., 2:].view(np.int8).astype(np.int64), d
    nib = blocks[..., 2:].astype(np.int64)
    return np.concatenate([(nib & 15) - 8, (nib >> 4) - 8], axis=-1), d


def integer_model(x, w, fmt):
    """matmul_q's contract: x quantized to Q8_0 (quantize_q8_0's bytes); per block pair the exact
    integer dot product times both scales (exact in float64); blocks summed in order in float64;
    one rounding to float32 (then to x's dtype)."""
    xq, xd = decode(opforge.quantize_q8_0(x), "q8_0")
    wq, wd = decode(w, fmt)
    s = np.einsum("mbj,nbj->mnb", xq.reshape(-1, *xq.shape[-2:]), wq)
    acc = np.zeros(s.shape[:2])
    for b in range(s.shape[2]):
        acc += s[:, :, b] * (wd[None, :, b] * xd.reshape(-1, xd.shape[-1])[:, None, b])
    return acc.astype(np.float32).reshape(x.shape[:-1] + (w.shape[0],))


def weights(rng, n, k, fmt):
    return QUANTIZE[fmt](rng.standard_normal((n, k)).astype(np.float32))


@pytest.mark.parametrize("fmt", BYTES)
@pytest.mark.parametrize("m, k, n", SHAPES, ids=str)
def test_matches_integer_model(simd_target, rng, m, k, n, fmt):
    x = (rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-2, 2, (m, 1))).astype(np.float32)
    w = weights(rng, n, k, fmt)
    np.testing.assert_array_equal(opforge.matmul_q(x, w, fmt), integer_model(x, w, fmt))


@pytest.mark.parametrize("fmt", BYTES)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 16])
def test_any_weight_bytes(simd_target, rng, m, fmt):
    """Weights from any tool, not only opforge's quantizer: every quant byte (Q8_0's -128, which
    the quantizer never writes, and every nibble), finite fp16 scales of any size."""
    n, k = 37, 320
    w = rng.integers(0, 256, (n, k // 32, BYTES[fmt]), dtype=np.uint8)
    w[..., :2] = (rng.standard_normal((n, k // 32)) * 2.0 ** rng.integers(-8, 8, (n, k // 32))).astype("<f2")[..., None].view(np.uint8)
    w = w.reshape(n, -1)
    if fmt == "q8_0":
        w[0, 2:34] = 0x80  # a whole block of -128
    x = rng.standard_normal((m, k)).astype(np.float32)
    np.testing.assert_array_equal(opforge.matmul_q(x, w, fmt), integer_model(x, w, fmt))


@pytest.mark.parametrize("fmt", BYTES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_half_inputs(simd_target, rng, fmt, dtype):
    # Through torch for bfloat16; the result is the float32 one rounded to x's dtype.
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(rng.standard_normal((5, 96))).to(getattr(torch, dtype))
    w = weights(rng, 7, 96, fmt)
    got = opforge.matmul_q(x, torch.from_numpy(w), fmt)
    assert got.dtype == x.dtype and got.shape == (5, 7)
    want = torch.from_numpy(integer_model(x.float().numpy(), w, fmt)).to(x.dtype)
    assert torch.equal(got, want)


@pytest.mark.parametrize("fmt", BYTES)
@pytest.mark.parametrize("m, k, n", [(1, 4096, 33), (32, 96, 17)], ids=str)
def test_close_to_dequantized_matmul(simd_target, rng, m, k, n, fmt):
    # Against x @ dequantize(w)^T in float64 (dequantize is exact: quant times fp16 scale).
    # The only approximation is x's Q8_0 quantization: per element at most
    # e_b = d_b * (0.5 + 2e-5) + 127 * |d_b - dh_b| (see test_quantize_q8_0's round trip), so
    # output (r, c) is off by at most sum over blocks of e_b(r) * sum |w_b(c)|, plus the final
    # float32 rounding (2^-24 relative; the float64 block sum adds < 2^-45).
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = weights(rng, n, k, fmt)
    wd = opforge.dequantize(w, fmt).astype(np.float64)
    want = x.astype(np.float64) @ wd.T
    got = opforge.matmul_q(x, w, fmt).astype(np.float64)
    xb = x.astype(np.float64).reshape(m, -1, 32)
    d = np.abs(xb).max(axis=-1) / 127
    dh = decode(opforge.quantize_q8_0(x), "q8_0")[1]
    e = d * (0.5 + 2e-5) + 127 * np.abs(d - dh)
    bound = e @ np.abs(wd.reshape(n, -1, 32)).sum(axis=-1).T
    assert (np.abs(got - want) <= bound + 2.0**-23 * (np.abs(want) + bound)).all()
    # The bound is a worst case (every rounding error with the sign of w): errors of both signs
    # cancel, and 800 random trials stayed below a quarter of it.
    assert np.abs(got - want).max() < 0.5 * bound.max()


def test_leading_dims_and_strides(simd_target, rng):
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    w = weights(rng, 9, 64, "q4_0")
    want = integer_model(x, w, "q4_0")
    got = opforge.matmul_q(x, w, "q4_0")
    assert got.shape == (2, 3, 9)
    np.testing.assert_array_equal(got, want)
    big = rng.standard_normal((2, 3, 192)).astype(np.float32)
    big[..., ::3] = x  # x as a view with inner stride 3, and a transposed copy of it
    np.testing.assert_array_equal(opforge.matmul_q(big[..., ::3], w, "q4_0"), want)
    np.testing.assert_array_equal(opforge.matmul_q(np.asfortranarray(x), w, "q4_0"), want)
    tall = np.zeros((2 * w.shape[0], w.shape[1]), np.uint8)
    tall[::2] = w  # every other row of a taller array, and a column-major copy: strided weights
    np.testing.assert_array_equal(opforge.matmul_q(x, tall[::2], "q4_0"), want)
    np.testing.assert_array_equal(opforge.matmul_q(x, np.asfortranarray(w), "q4_0"), want)


@pytest.mark.parametrize("x_shape, w_shape, out_shape", [
    ((0, 64), (5, 36), (0, 5)), ((2, 0, 64), (5, 36), (2, 0, 5)), ((3, 64), (0, 36), (3, 0)),
    ((3, 0), (5, 0), (3, 5))])
def test_empty(simd_target, rng, x_shape, w_shape, out_shape):
    got = opforge.matmul_q(np.ones(x_shape, np.float32), np.zeros(w_shape, np.uint8), "q4_0")
    assert got.shape == out_shape and got.dtype == np.float32
    assert not got.any()  # k = 0: empty sums are 0


def test_same_bits_on_any_thread_count(rng):
    x = rng.standard_normal((32, 1024)).astype(np.float32)
    w = weights(rng, 257, 1024, "q8_0")
    before = opforge.num_threads()
    try:
        opforge.set_num_threads(1)
        one = opforge.matmul_q(x, w, "q8_0")
        opforge.set_num_threads(3)
        np.testing.assert_array_equal(opforge.matmul_q(x, w, "q8_0"), one)
    finally:
        opforge.set_num_threads(before)


def test_jax_jit_and_vmap(rng):
    jax = pytest.importorskip("jax")
    import opforge.jax as oj

    x = rng.standard_normal((4, 3, 64)).astype(np.float32)
    w = weights(rng, 5, 64, "q8_0")
    f = jax.jit(lambda a, b: oj.matmul_q(a, b, "q8_0"))
    np.testing.assert_array_equal(np.asarray(f(x, w)), integer_model(x, w, "q8_0"))
    over_x = jax.jit(jax.vmap(lambda a: oj.matmul_q(a, w, "q8_0")))
    np.testing.assert_array_equal(np.asarray(over_x(x)), integer_model(x, w, "q8_0"))
    assert over_x.lower(x).as_text().count("opforge_call") == 1  # batches through leading dims
    ws = np.stack([w, weights(rng, 5, 64, "q8_0")])
    over_w = jax.vmap(lambda b: oj.matmul_q(x[0], b, "q8_0"))(ws)  # w is not batchable: a loop
    np.testing.assert_array_equal(np.asarray(over_w), np.stack([integer_model(x[0], b, "q8_0") for b in ws]))


def test_torch_adapter(rng):
    torch = pytest.importorskip("torch")
    ot = pytest.importorskip("opforge.torch")
    x = torch.randn(3, 64)
    w = weights(rng, 5, 64, "q4_0")
    got = ot.matmul_q(x, torch.from_numpy(w), "q4_0")
    np.testing.assert_array_equal(got.numpy(), integer_model(x.numpy(), w, "q4_0"))


X, W4 = np.ones((2, 64), np.float32), np.zeros((5, 36), np.uint8)


@pytest.mark.parametrize("call, error, message", [
    (lambda: opforge.matmul_q(np.ones((2, 48), np.float32), W4, "q4_0"), ValueError,
     r"matmul_q\(\): 'x' last dimension must be a multiple of 32, got 48"),
    (lambda: opforge.matmul_q(X, W4, "q8_0"), ValueError,
     r"matmul_q\(\): 'w' must have shape \[n, 68\] \(k / 32 \* 34 bytes per row for format 'q8_0' and k = 64\), "
     r"got \[5, 36\]"),
    (lambda: opforge.matmul_q(X, np.zeros((5, 37), np.uint8), "q4_0"), ValueError,
     r"matmul_q\(\): 'w' must have shape \[n, 36\] .*, got \[5, 37\]"),
    (lambda: opforge.matmul_q(X, W4.astype(np.float32), "q4_0"), TypeError,
     r"matmul_q\(\): 'w' must have dtype uint8, got float32"),
    (lambda: opforge.matmul_q(X.astype(np.float64), W4, "q4_0"), TypeError,
     r"matmul_q\(\): 'x' must have dtype in \[float32, float16, bfloat16\], got float64"),
    (lambda: opforge.matmul_q(X, W4[0], "q4_0"), ValueError, r"matmul_q\(\): 'w' must have rank 2, got rank 1"),
    (lambda: opforge.matmul_q(X, W4, "Q4_0"), ValueError,
     r"matmul_q\(\): 'format' must be 'q8_0' or 'q4_0', got 'Q4_0'"),
])
def test_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()
