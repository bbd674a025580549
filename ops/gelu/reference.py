"""gelu's references: the same computation in each framework, used by the tests and the tour."""


def sample(rng, rows=512, cols=1024):
    """Inputs for a run: positional arrays (float64 NumPy) and attributes."""
    return [rng.standard_normal((rows, cols))], {"approximate": "none"}


def numpy(x, approximate="none"):
    import math

    import numpy as np

    x64 = x.astype(np.float64)
    if approximate == "tanh":
        out = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    else:  # NumPy has no erf: math.erfc element by element
        out = 0.5 * x64 * np.vectorize(math.erfc, otypes=[np.float64])(-x64 / math.sqrt(2))
    return out.astype(x.dtype)


def torch(x, approximate="none"):
    import torch

    return torch.nn.functional.gelu(x, approximate=approximate)


def jax(x, approximate="none"):
    import jax

    return jax.nn.gelu(x, approximate=approximate == "tanh")
