"""dequantize's reference: a NumPy transcription of ggml's dequantize_row_q8_0 / _q4_0 (no
framework has ggml's formats: the torch and jax entries run it on the arrays' bytes)."""

# The torch and jax entries run the NumPy transcription: correct references, not competitors
# (bench/bench_ops.py times only opforge for such ops).
FRAMEWORK_NATIVE = False

BYTES = {"q8_0": 34, "q4_0": 18}


def sample(rng, rows=512, cols=1024):
    """Q8_0 rows of cols // 32 blocks (at least one) from real data: quantize_q8_0's reference
    applied to normal values."""
    from . import quantize_q8_0

    blocks = max(1, cols // 32)
    return [quantize_q8_0.numpy(rng.standard_normal((rows, blocks * 32)))], {"format": "q8_0"}


def numpy(q, format):
    """One float32 product per value: q * d (Q8_0), (q - 8) * d (Q4_0), d the block's fp16 scale."""
    import numpy as np

    q = np.ascontiguousarray(q, np.uint8)
    nb = q.shape[-1] // BYTES[format]
    blocks = q.reshape(q.shape[:-1] + (nb, BYTES[format]))
    d = blocks[..., :2].copy().view("<f2").astype(np.float32)
    if format == "q8_0":
        quants = blocks[..., 2:].view(np.int8)
    else:
        nib = blocks[..., 2:].astype(np.int16)
        quants = np.concatenate([(nib & 15) - 8, (nib >> 4 & 15) - 8], axis=-1)
    with np.errstate(invalid="ignore", over="ignore"):
        out = quants.astype(np.float32) * d
    return out.reshape(q.shape[:-1] + (nb * 32,))


def torch(q, format):
    import torch

    return torch.from_numpy(numpy(q.cpu().numpy(), format)).to(q.device)


def jax(q, format):
    import jax.numpy as jnp
    import numpy as np

    return jnp.asarray(numpy(np.asarray(q), format))


def ggml(q, format):
    """ggml's own library (opforge.ggml_cpu): the format's to_float."""
    from opforge import ggml_cpu

    return ggml_cpu.load().dequantize(q, format)
