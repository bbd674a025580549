"""mul's references: the same computation in each framework, used by the tests and the tour."""


def sample(rng, rows=512, cols=1024):
    """Inputs for a run: positional arrays (float64 NumPy) and attributes."""
    return [rng.standard_normal((rows, cols)), rng.standard_normal((cols,))], {}


def numpy(x, y):
    return x * y


def torch(x, y):
    return x * y


def jax(x, y):
    return x * y
