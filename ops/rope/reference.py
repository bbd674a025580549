"""rope's references: the same rotation written natively in each framework, for the tests, the
tour and the benchmark. Tables are [seq, dim/2]; interleaved=False is HF's rotate_half."""


def tables(seq, dim, base=10000.0):
    """cos and sin of position p times theta_i = base^(-2i/dim), shape [seq, dim/2], float64."""
    import numpy as np

    angles = np.outer(np.arange(seq, dtype=np.float64), base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim))
    return np.cos(angles), np.sin(angles)


def sample(rng, rows=512, cols=1024):
    """x of shape [batch, seq, heads, dim] with batch * seq = rows and heads * dim = cols
    (rounded: dim even, 128 at most per head), and its cos/sin tables."""
    heads = max(1, cols // 128)
    dim = 2 * max(1, cols // heads // 2)
    seq = min(rows, 128)
    batch = max(1, rows // seq)
    cos, sin = tables(seq, dim)
    return [rng.standard_normal((batch, seq, heads, dim)), cos, sin], {"interleaved": False}


def numpy(x, cos, sin, interleaved=False):
    import numpy as np

    c, s = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return np.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(x.shape)
    a, b = np.split(x, 2, axis=-1)
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def torch(x, cos, sin, interleaved=False):
    import torch

    if interleaved:  # GPT-J's rotate_every_two on tables repeated per pair
        c = cos.repeat_interleave(2, dim=-1)[:, None, :]
        s = sin.repeat_interleave(2, dim=-1)[:, None, :]
        swapped = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
        return x * c + swapped * s
    c = torch.cat([cos, cos], dim=-1)[:, None, :]  # HF llama's apply_rotary_pos_emb
    s = torch.cat([sin, sin], dim=-1)[:, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return x * c + torch.cat([-x2, x1], dim=-1) * s


def jax(x, cos, sin, interleaved=False):
    import jax.numpy as jnp

    c, s = cos[:, None, :], sin[:, None, :]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return jnp.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(x.shape)
    a, b = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([a * c - b * s, a * s + b * c], axis=-1)
