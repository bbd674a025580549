"""gelu_backward's references: the gradient of gelu in each framework, used by the tour."""


def sample(rng, rows=512, cols=1024):
    """Inputs for a run (grad, x): positional arrays (float64 NumPy) and attributes."""
    return [rng.standard_normal((rows, cols)), rng.standard_normal((rows, cols))], {"approximate": "none"}


def numpy(grad, x, approximate="none"):
    import math

    import numpy as np

    x64, g64 = x.astype(np.float64), grad.astype(np.float64)
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        t = np.tanh(k * (x64 + 0.044715 * x64**3))
        d = 0.5 * (1 + t) + 0.5 * x64 * (1 - t * t) * k * (1 + 3 * 0.044715 * x64**2)
    else:  # NumPy has no erf: math.erfc element by element
        cdf = 0.5 * np.vectorize(math.erfc, otypes=[np.float64])(-x64 / math.sqrt(2))
        d = cdf + x64 * np.exp(-0.5 * x64 * x64) / math.sqrt(2 * math.pi)
    return (g64 * d).astype(grad.dtype)


def torch(grad, x, approximate="none"):
    import torch

    return torch.ops.aten.gelu_backward(grad, x, approximate=approximate)


def jax(grad, x, approximate="none"):
    import jax

    return jax.vjp(lambda v: jax.nn.gelu(v, approximate=approximate == "tanh"), x)[1](grad)[0]
