"""rms_norm's references: the same computation in each framework, used by the tests and the tour."""


def sample(rng, rows=512, cols=1024):
    """Inputs for a run: positional arrays (float64 NumPy) and attributes."""
    return [rng.standard_normal((rows, cols)), rng.standard_normal((cols,))], {"eps": 1e-6}


def numpy(x, weight, eps=1e-6):
    import numpy as np

    x64 = x.astype(np.float64)
    out = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * weight.astype(np.float64)
    return out.astype(x.dtype)


def torch(x, weight, eps=1e-6):
    import torch

    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def jax(x, weight, eps=1e-6):
    import jax
    import jax.numpy as jnp

    x32 = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    inv = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * inv * weight.astype(x32.dtype)).astype(x.dtype)
