"""silu_backward's references: the gradient of silu in each framework, used by the tour."""


def sample(rng, rows=512, cols=1024):
    """Inputs for a run (grad, x): positional arrays (float64 NumPy) and attributes."""
    return [rng.standard_normal((rows, cols)), rng.standard_normal((rows, cols))], {}


def numpy(grad, x):
    import numpy as np

    with np.errstate(over="ignore"):
        s = 1 / (1 + np.exp(-x))
    return grad * s * (1 + x * (1 - s))


def torch(grad, x):
    import torch

    return torch.ops.aten.silu_backward(grad, x)


def jax(grad, x):
    import jax

    return jax.vjp(jax.nn.silu, x)[1](grad)[0]
