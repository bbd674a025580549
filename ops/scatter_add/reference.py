"""scatter_add's references: the same bucket sums written natively in each framework (NumPy's
add.at, torch's index_add, jax.ops.segment_sum), for the tests, the tour and the benchmark."""


def sample(rng, rows=512, cols=1024):
    """src [rows, cols] summed along dim 0 into 16 buckets (each row's bucket drawn at random,
    so buckets repeat and some stay empty), as when pooling rows by segment. The bucket count
    does not follow rows, so one set of attributes serves every size."""
    import numpy as np

    dim_size = 16
    return [rng.standard_normal((rows, cols)), rng.integers(0, dim_size, rows, dtype=np.int64)], {
        "dim_size": dim_size, "dim": 0}


def numpy(src, index, dim_size, dim=0):
    import numpy as np

    moved = np.moveaxis(src, dim, 0)
    out = np.zeros((dim_size,) + moved.shape[1:], dtype=src.dtype)
    np.add.at(out, np.asarray(index, dtype=np.int64), moved)
    return np.moveaxis(out, 0, dim)


def torch(src, index, dim_size, dim=0):
    import torch

    shape = list(src.shape)
    shape[dim] = dim_size
    return torch.zeros(shape, dtype=src.dtype, device=src.device).index_add_(dim, index.long(), src)


def jax(src, index, dim_size, dim=0):
    import jax
    import jax.numpy as jnp

    summed = jax.ops.segment_sum(jnp.moveaxis(src, dim, 0), index, num_segments=dim_size)
    return jnp.moveaxis(summed, 0, dim)
