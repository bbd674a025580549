"""matmul_q's reference: its integer model in NumPy, independent of opforge. x is quantized to
Q8_0 by quantize_q8_0's reference; each block pair contributes its exact integer dot product
times both fp16 scales (exact in float64); blocks are summed in float64, then rounded to x's
dtype. The torch and jax entries run the same model on the arrays' values."""

from . import quantize_q8_0

# The torch and jax entries run the NumPy transcription: correct references, not competitors
# (bench/bench_ops.py times only opforge for such ops).
FRAMEWORK_NATIVE = False

BYTES = {"q8_0": 34, "q4_0": 18}


def sample(rng, rows=512, cols=1024):
    """x [rows, k] and a Q8_0 weight of k // 2 rows (n), k the multiple of 32 at or below cols."""
    k = max(32, cols // 32 * 32)
    n = max(1, k // 2)
    w = quantize_q8_0.numpy(rng.standard_normal((n, k)))
    return [rng.standard_normal((rows, k)), w], {"format": "q8_0"}


def flops(arrays):
    """Multiply-adds of the product, counted twice: 2 m n k."""
    x, w = arrays[0], arrays[1]
    k = x.shape[-1]
    return 2 * (x.size // k if k else 0) * w.shape[0] * k


def _decode(q, format):
    """(quants as int64 [..., blocks, 32], fp16 scales as float64 [..., blocks])."""
    import numpy as np

    q = np.ascontiguousarray(q, np.uint8)
    blocks = q.reshape(q.shape[:-1] + (q.shape[-1] // BYTES[format], BYTES[format]))
    d = blocks[..., :2].copy().view("<f2")[..., 0].astype(np.float64)
    if format == "q8_0":
        return blocks[..., 2:].view(np.int8).astype(np.int64), d
    nib = blocks[..., 2:].astype(np.int64)
    return np.concatenate([(nib & 15) - 8, (nib >> 4) - 8], axis=-1), d


def model(x, w, format):
    """float64 result [..., n] of the integer model, before the final rounding."""
    import numpy as np

    xq, xd = _decode(quantize_q8_0.numpy(x), "q8_0")
    wq, wd = _decode(w, format)
    xq, xd = xq.reshape(-1, *xq.shape[-2:]), xd.reshape(-1, xd.shape[-1])
    s = np.einsum("mbj,nbj->mnb", xq, wq).astype(np.float64)
    acc = np.zeros(s.shape[:2])
    for b in range(s.shape[2]):  # in block order, as the contract says
        acc += s[:, :, b] * (wd[None, :, b] * xd[:, None, b])
    return acc.reshape(np.shape(x)[:-1] + (w.shape[0],))


def numpy(x, w, format):
    import numpy as np

    out = model(np.asarray(x, np.float32), w, format)
    return out.astype(np.float32).astype(x.dtype) if x.dtype != np.float64 else out.astype(np.float32).astype(np.float64)


def torch(x, w, format):
    import torch

    out = model(x.detach().cpu().float().numpy(), w.cpu().numpy(), format)
    return torch.from_numpy(out).to(torch.float32).to(x.dtype).to(x.device)


def jax(x, w, format):
    import jax.numpy as jnp
    import numpy as np

    out = model(np.asarray(x.astype(jnp.float32)), np.asarray(w), format)
    return jnp.asarray(out.astype(np.float32)).astype(x.dtype)
