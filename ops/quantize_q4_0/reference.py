"""quantize_q4_0's reference: a NumPy transcription of ggml's quantize_row_q4_0_ref with its
float32 roundings (no framework has ggml's formats: the torch and jax entries run the same
transcription on the arrays' values). Used by the op's tests, the adapters' tests and the tour."""

# The torch and jax entries run the NumPy transcription: correct references, not competitors
# (bench/bench_ops.py times only opforge for such ops).
FRAMEWORK_NATIVE = False

BLOCK = 32


def sample(rng, rows=512, cols=1024):
    """x [rows, k], k the multiple of 32 at or below cols (at least 32), with block scales
    spread over 1e-3..1e3 so the fp16 scales vary widely."""
    k = max(BLOCK, cols // BLOCK * BLOCK)
    x = rng.standard_normal((rows, k))
    if x.size:
        x *= 10.0 ** rng.uniform(-3, 3, (rows, k // BLOCK)).repeat(BLOCK, axis=1)
    return [x], {}


def numpy(x):
    """max = the first value of largest magnitude (+0 in an all-zero block), d = max / -8,
    id = 1 / d (0 for d = 0), q = min(15, trunc(x * id + 8.5)) with the product and the sum each
    rounded to float32; d as little-endian fp16, then 16 bytes holding element j in the low
    nibble and element j + 16 in the high nibble."""
    import numpy as np

    x = np.ascontiguousarray(x, np.float32)
    nb = x.shape[-1] // BLOCK
    blocks = x.reshape(x.shape[:-1] + (nb, BLOCK))
    first = np.abs(blocks).argmax(axis=-1)  # argmax keeps the first, like ggml's strict `<`
    mx = np.take_along_axis(blocks, first[..., None], axis=-1)[..., 0]
    mx = np.where(mx == 0, np.float32(0), mx)
    d = mx / np.float32(-8)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0))
    q = np.minimum(15, np.trunc(blocks * inv[..., None] + np.float32(8.5))).astype(np.uint8)
    scale = d.astype("<f2").view(np.uint8).reshape(d.shape + (2,))
    out = np.concatenate([scale, q[..., :16] | (q[..., 16:] << 4)], axis=-1)
    return out.reshape(x.shape[:-1] + (nb * 18,))


def torch(x):
    import torch

    return torch.from_numpy(numpy(x.detach().cpu().float().numpy())).to(x.device)


def jax(x):
    import jax.numpy as jnp
    import numpy as np

    return jnp.asarray(numpy(np.asarray(x.astype(jnp.float32))))


def ggml(x):
    """ggml's own library (opforge.ggml_cpu): its ggml_quantize_chunk. The tour's ggml rows time
    opforge against it."""
    from opforge import ggml_cpu

    return ggml_cpu.load().quantize(x, "q4_0")
