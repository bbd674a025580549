"""relu_backward's references: the gradient of relu in each framework, used by the tour."""


def sample(rng, rows=512, cols=1024):
    """Inputs for a run (grad, x): positional arrays (float64 NumPy) and attributes."""
    return [rng.standard_normal((rows, cols)), rng.standard_normal((rows, cols))], {}


def numpy(grad, x):
    import numpy as np

    return np.where(x <= 0, np.zeros_like(grad), grad)


def torch(grad, x):
    import torch

    return torch.ops.aten.threshold_backward(grad, x, 0)


def jax(grad, x):
    import jax

    return jax.vjp(jax.nn.relu, x)[1](grad)[0]
