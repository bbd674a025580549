"""linear_act's references: act(x @ weight^T + bias) in each framework, used by the tests, the tour
and the benchmark (which reports GFLOP/s through flops())."""


def sample(rng, rows=512, cols=1024):
    """x [rows, cols], weight [cols, cols] (n = k = cols, scaled so outputs stay O(1)), bias [cols]."""
    x = rng.standard_normal((rows, cols))
    weight = rng.standard_normal((cols, cols)) / max(1, cols) ** 0.5
    return [x, weight, rng.standard_normal(cols)], {"act": "gelu"}


def flops(arrays):
    """Multiply-adds of the product, counted twice: 2 m n k."""
    x, weight = arrays[0], arrays[1]
    n, k = weight.shape
    m = x.size // k if k else 0
    return 2 * m * n * k


def numpy(x, weight, bias=None, act="none"):
    import math

    import numpy as np

    z = x.astype(np.float64) @ weight.astype(np.float64).T
    if bias is not None:
        z = z + bias.astype(np.float64)
    if act == "relu":
        z = np.maximum(z, 0)
    elif act == "gelu":  # NumPy has no erf: math.erfc element by element
        z = 0.5 * z * np.vectorize(math.erfc, otypes=[np.float64])(-z / math.sqrt(2))
    elif act == "gelu_tanh":
        z = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    elif act == "silu":
        z = z / (1 + np.exp(-z))
    return z.astype(x.dtype)


def torch(x, weight, bias=None, act="none"):
    import torch

    F = torch.nn.functional
    z = F.linear(x, weight, bias)
    if act == "relu":
        return F.relu(z)
    if act == "gelu":
        return F.gelu(z)
    if act == "gelu_tanh":
        return F.gelu(z, approximate="tanh")
    if act == "silu":
        return F.silu(z)
    return z


def jax(x, weight, bias=None, act="none"):
    import jax

    # "highest": XLA's default float32 product on a GPU rounds its inputs to TF32 (10 mantissa bits)
    z = jax.numpy.matmul(x, weight.T, precision="highest")
    if bias is not None:
        z = z + bias
    if act == "relu":
        return jax.nn.relu(z)
    if act in ("gelu", "gelu_tanh"):
        return jax.nn.gelu(z, approximate=act == "gelu_tanh")
    if act == "silu":
        return jax.nn.silu(z)
    return z
