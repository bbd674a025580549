"""relu's references: the same computation in each framework, used by the tests and the tour."""


def sample(rng, rows=512, cols=1024):
    """Inputs for a run: positional arrays (float64 NumPy) and attributes."""
    return [rng.standard_normal((rows, cols))], {}


def numpy(x):
    import numpy as np

    return np.maximum(x, 0)


def torch(x):
    import torch

    return torch.relu(x)


def jax(x):
    import jax

    return jax.nn.relu(x)
