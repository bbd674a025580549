"""relu_backward's references: the gradient of relu in each framework, used by the tour."""


def sample(rng, rows=512, cols=1024):
    """Inputs for a run (grad, result: relu's): positional arrays (float64 NumPy) and attributes."""
    return [rng.standard_normal((rows, cols)), rng.standard_normal((rows, cols)).clip(0)], {}


def numpy(grad, result):
    import numpy as np

    return np.where(result <= 0, np.zeros_like(grad), grad)


def torch(grad, result):
    import torch

    return torch.ops.aten.threshold_backward(grad, result, 0)  # what torch's ReluBackward runs on its result


def jax(grad, result):
    import jax

    return jax.vjp(jax.nn.relu, result)[1](grad)[0]  # relu'(relu(x)) is relu'(x)
