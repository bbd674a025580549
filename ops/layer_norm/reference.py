"""layer_norm's references: the same computation in each framework, used by the tests and the tour."""


def sample(rng, rows=512, cols=1024):
    """Inputs for a run: positional arrays (float64 NumPy) and attributes."""
    return [rng.standard_normal((rows, cols)), rng.standard_normal((cols,)), rng.standard_normal((cols,))], {"eps": 1e-5}


def numpy(x, weight, bias=None, eps=1e-5):
    import numpy as np

    x64 = x.astype(np.float64)
    d = x64 - np.mean(x64, axis=-1, keepdims=True)
    out = d / np.sqrt(np.mean(d * d, axis=-1, keepdims=True) + eps) * weight.astype(np.float64)
    if bias is not None:
        out = out + bias.astype(np.float64)
    return out.astype(x.dtype)


def torch(x, weight, bias=None, eps=1e-5):
    import torch

    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def jax(x, weight, bias=None, eps=1e-5):
    import jax
    import jax.numpy as jnp

    x32 = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    out = (x32 - mean) * jax.lax.rsqrt(var + eps) * weight.astype(x32.dtype)
    if bias is not None:
        out = out + bias.astype(x32.dtype)
    return out.astype(x.dtype)
