"""scatter_add against NumPy (float64 and, bit for bit, the sequential sum in the compute type),
torch's index_add and jax.ops.segment_sum, on every float dtype, SIMD target and layout; its
gradient through torch autograd and jax.grad; every error path."""

import numpy as np
import pytest
import torch

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, TOLERANCES, assert_result, cases, has_dtype, random,
                             strided, to_float64, to_framework)

# Relative precision of the accumulation: float32 for the half types.
COMPUTE_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-24, "bfloat16": 2.0**-24}

# (src shape, dim, dim_size): odd lengths leave SIMD tails; dim_size above n leaves empty buckets.
SHAPES = [((1,), 0, 1), ((7,), 0, 3), ((4097,), 0, 5), ((6, 33), 0, 4), ((6, 33), 1, 7), ((6, 33), -1, 40),
          ((2, 3, 4097), 1, 2), ((3, 5, 7), 2, 3), ((3, 5, 7), -3, 9), ((0,), 0, 3), ((4, 0, 2), 0, 3)]


def reference(src64, index, dim_size, dim):
    """float64: out[..., j, ...] = sum of src[..., i, ...] over index[i] == j."""
    moved = np.moveaxis(src64, dim, 0)
    out = np.zeros((dim_size,) + moved.shape[1:])
    np.add.at(out, np.asarray(index, dtype=np.int64), moved)
    return np.moveaxis(out, 0, dim)


def assert_close(got, want, scale, terms, dtype):
    """Within dtype's tolerance of the float64 sum, plus the rounding a sum of `terms` terms of
    magnitude `scale` may pick up in the compute type."""
    rtol, atol = TOLERANCES[dtype]
    g = to_float64(got)
    assert g.shape == want.shape
    np.testing.assert_array_less(np.abs(g - want), atol + rtol * np.abs(want) + terms * COMPUTE_EPS[dtype] * scale)


def sequential(src, index, dim_size, dim, dtype):
    """The sum each bucket must equal bit for bit: in increasing i, in float32 for the half types,
    rounded once (round to nearest even)."""
    acc = np.float64 if dtype == "float64" else np.float32
    moved = np.moveaxis(to_float64(src).astype(acc), dim, 0)
    out = np.zeros((dim_size,) + moved.shape[1:], dtype=acc)
    np.add.at(out, np.asarray(index, dtype=np.int64), moved)  # unbuffered: in index order
    return torch.from_numpy(np.ascontiguousarray(np.moveaxis(out, 0, dim))).to(getattr(torch, dtype))


def index_array(rng, n, dim_size, framework, index_dtype="int64"):
    values = rng.integers(0, max(dim_size, 1), n)
    if framework == "torch":
        return torch.from_numpy(values).to(getattr(torch, index_dtype))
    if framework == "jax":
        import jax.numpy as jnp

        return jnp.asarray(values, dtype=index_dtype)
    return values.astype(index_dtype)


def check(src, index, dim_size, dim, framework, dtype):
    got = opforge.scatter_add(src, index, dim_size, dim)
    want = reference(to_float64(src), to_float64(index), dim_size, dim)
    assert_result(got, framework, dtype, want.shape)
    scale = reference(np.abs(to_float64(src)), to_float64(index), dim_size, dim)
    assert_close(got, want, scale, len(index), dtype)
    exact = sequential(src, to_float64(index), dim_size, dim, dtype)
    assert torch.equal(torch.from_numpy(to_float64(got)), exact.double()), "not the sequential sum, bit for bit"


@pytest.mark.parametrize("shape, dim, dim_size", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy", "torch"], FLOAT_DTYPES))
def test_shapes(simd_target, rng, framework, dtype, shape, dim, dim_size):
    src = to_framework(random(rng, shape, dtype), framework, dtype)
    check(src, index_array(rng, shape[dim], dim_size, framework), dim_size, dim, framework, dtype)


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_repeated_and_skewed_indices(simd_target, rng, framework, index_dtype):
    # Everything into one bucket, then one bucket holding most of them, then a permutation.
    src = to_framework(random(rng, (300, 17), "float32"), framework, "float32")
    for values in (np.full(300, 2), np.where(rng.random(300) < 0.9, 0, rng.integers(0, 5, 300)),
                   rng.permutation(300) % 5):
        index = torch.from_numpy(values).to(getattr(torch, index_dtype)) if framework == "torch" else \
            values.astype(index_dtype)
        check(src, index, 5, 0, framework, "float32")


@pytest.mark.parametrize("framework, kind, dtype", [
    (f, k, d) for f in ("numpy", "torch") for k in STRIDED_KINDS[f] for d in FLOAT_DTYPES if has_dtype(f, d)])
def test_strided(simd_target, rng, framework, kind, dtype):
    # Strided src along each dim (transposed: slices are not contiguous and get gathered), and a
    # strided index.
    for dim in (0, 1, 2):
        src, _ = strided(rng, (5, 6, 9), framework, dtype, kind)
        check(src, index_array(rng, src.shape[dim], 4, framework), 4, dim, framework, dtype)
    src = to_framework(random(rng, (12, 9), dtype), framework, dtype)
    values = rng.integers(0, 4, 36)
    index = values[::3] if framework == "numpy" else torch.from_numpy(values)[::3]
    check(src, index, 4, 0, framework, dtype)
    if framework == "numpy":
        check(src, values[:12][::-1], 4, 0, framework, dtype)
    check(src, np.broadcast_to(np.int64(3), (12,)) if framework == "numpy" else torch.tensor(3).expand(12),
          4, 0, framework, dtype)


# The kernel streams src into per-task accumulators, split along the slices when few, or (for
# many buckets of long slices) sorts by bucket and gathers; all must give the sequential bits.
STRATEGIES = [((3000, 20), 0, 20000), ((300, 200), 0, 7), ((5, 300, 3), 1, 40000), ((2, 500, 40), 1, 9000)]


@pytest.mark.parametrize("shape, dim, dim_size", STRATEGIES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["torch"], FLOAT_DTYPES))
def test_strategies(simd_target, rng, framework, dtype, shape, dim, dim_size):
    src = to_framework(random(rng, shape, dtype), framework, dtype)
    check(src, index_array(rng, shape[dim], dim_size, framework), dim_size, dim, framework, dtype)


@pytest.fixture
def restore_threads():
    before = opforge.num_threads()
    yield
    opforge.set_num_threads(before)


@pytest.mark.parametrize("shape, dim, dim_size", [((20000, 16), 0, 37), ((64, 4099), 1, 37), ((200000,), 0, 37),
                                                  ((300, 200), 0, 7), ((3000, 20), 0, 20000)], ids=str)
def test_deterministic_across_thread_counts(simd_target, rng, restore_threads, shape, dim, dim_size):
    src = torch.from_numpy(random(rng, shape, "float32")).float()
    index = torch.from_numpy(rng.integers(0, dim_size, shape[dim]))
    results = []
    for threads in (1, 2, 1, 2):
        opforge.set_num_threads(threads)
        results.append(opforge.scatter_add(src, index, dim_size, dim))
    assert all(torch.equal(r, results[0]) for r in results[1:])
    check(src, index, dim_size, dim, "torch", "float32")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matches_torch_index_add(rng, dtype):
    src = torch.from_numpy(random(rng, (7, 40, 3), dtype)).to(getattr(torch, dtype))
    index = torch.from_numpy(rng.integers(0, 11, 40))
    want = torch.zeros(7, 11, 3, dtype=src.dtype).index_add_(1, index, src)
    torch.testing.assert_close(opforge.scatter_add(src, index, 11, 1), want)


def test_torch_autograd(rng):
    import opforge.torch as ot

    src = torch.from_numpy(random(rng, (6, 9, 4), "float64")).requires_grad_()
    index = torch.from_numpy(rng.integers(0, 5, 9))
    assert torch.autograd.gradcheck(lambda s: ot.scatter_add(s, index, 5, 1), (src,))
    ot.scatter_add(src, index, 5, 1).sin().sum().backward()
    theirs = src.detach().clone().requires_grad_()
    torch.zeros(6, 5, 4, dtype=torch.float64).index_add(1, index, theirs).sin().sum().backward()
    torch.testing.assert_close(src.grad, theirs.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["scatter_add", "scatter_add_backward"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(rng, name, dtype):
    # The generic torch tests skip these ops (no reference.py: its inputs would all be cast to
    # floats), so the same checks run here.
    import opforge.torch  # noqa: F401

    src = torch.from_numpy(random(rng, (5, 7), dtype)).to(getattr(torch, dtype))
    index = torch.from_numpy(rng.integers(0, 4, 7))
    if name == "scatter_add":
        args, attrs = (src.requires_grad_(), index), {"dim_size": 4, "dim": 1}
    else:
        args, attrs = (src, index), {"dim": 1}
    torch.library.opcheck(getattr(torch.ops.opforge, name).default, args, attrs)


@pytest.mark.parametrize("framework, dtype", cases(["jax"], FLOAT_DTYPES))
def test_jax(simd_target, rng, framework, dtype):
    import jax
    import jax.numpy as jnp

    import opforge.jax as oj

    src = to_framework(random(rng, (9, 5), dtype), framework, dtype)
    for index_dtype in ("int32", "int64"):
        index = index_array(rng, 9, 4, "jax", index_dtype)
        check(src, index, 4, 0, framework, dtype)
        got = jax.jit(lambda s, i: oj.scatter_add(s, i, 4))(src, index)
        want = jax.ops.segment_sum(src.astype(jnp.float64), index, num_segments=4)
        scale = jax.ops.segment_sum(jnp.abs(src.astype(jnp.float64)), index, num_segments=4)
        assert_close(got, np.asarray(want), np.asarray(scale), 9, dtype)


def test_jax_grad_and_vmap(rng):
    import jax
    import jax.numpy as jnp
    from jax.test_util import check_grads

    import opforge.jax as oj

    src = jnp.asarray(random(rng, (9, 5), "float64"))
    index = jnp.asarray(rng.integers(0, 4, 9))
    check_grads(lambda s: oj.scatter_add(s, index, 4), (src,), order=1, modes=["rev"])
    ours = jax.grad(lambda s: jnp.sum(jnp.sin(oj.scatter_add(s, index, 4))))(src)
    theirs = jax.grad(lambda s: jnp.sum(jnp.sin(jax.ops.segment_sum(s, index, num_segments=4))))(src)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-12, atol=1e-12)
    srcs = jnp.asarray(random(rng, (3, 9, 5), "float64"))
    indices = jnp.asarray(rng.integers(0, 4, (3, 9)))
    got = jax.jit(jax.vmap(lambda s, i: oj.scatter_add(s, i, 4)))(srcs, indices)
    want = jnp.stack([jax.ops.segment_sum(s, i, num_segments=4) for s, i in zip(srcs, indices)])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-12)


def test_jax_bad_index_fails_at_run_time(rng):
    # Values are only known when the kernel runs: the jitted call raises XLA's runtime error,
    # carrying opforge's message.
    import jax
    import jax.numpy as jnp

    import opforge.jax as oj

    with pytest.raises(Exception, match=r"scatter_add\(\): 'index' must hold values in \[0, dim_size\) = \[0, 4\), "
                                        r"got 4 at position 2"):
        jax.block_until_ready(jax.jit(lambda s, i: oj.scatter_add(s, i, 4))(jnp.ones((3, 2)), jnp.array([0, 3, 4])))


S = np.ones((4, 3), np.float32)
I = np.array([0, 2, 1, 2])


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.scatter_add(S, np.array([0, 2, 5, 9]), 3), ValueError,
     r"scatter_add\(\): 'index' must hold values in \[0, dim_size\) = \[0, 3\), got 5 at position 2"),
    (lambda: opforge.scatter_add(S, np.array([0, -1, 1, 1], np.int32), 3), ValueError,
     r"scatter_add\(\): 'index' must hold values in \[0, dim_size\) = \[0, 3\), got -1 at position 1"),
    (lambda: opforge.scatter_add(S, torch.tensor([0, 1, 2, 2**40]), 3), ValueError, r"got 1099511627776 at position 3"),
    (lambda: opforge.scatter_add(S, I.astype(np.float32), 3), TypeError,
     r"scatter_add\(\): 'index' must have dtype in \[int32, int64\], got float32"),
    (lambda: opforge.scatter_add(S, I.reshape(2, 2), 3), ValueError,
     r"scatter_add\(\): 'index' must have rank 1, got rank 2 \(shape \[2, 2\]\)"),
    (lambda: opforge.scatter_add(S, I[:3], 3), ValueError, r"scatter_add\(\): 'index' must have shape \[4\], got \[3\]"),
    (lambda: opforge.scatter_add(S, I, 3, dim=1), ValueError,
     r"scatter_add\(\): 'index' must have shape \[3\], got \[4\]"),
    (lambda: opforge.scatter_add(S, I, 3, dim=2), ValueError,
     r"scatter_add\(\): 'dim' must be in \[-2, 2\) for 'src' of rank 2, got 2"),
    (lambda: opforge.scatter_add(S, I, 3, dim=-3), ValueError, r"'dim' must be in \[-2, 2\) for 'src' of rank 2, got -3"),
    (lambda: opforge.scatter_add(S, I, -1), ValueError, r"scatter_add\(\): 'dim_size' must be >= 0, got -1"),
    # Empty results still check the index: nothing is in [0, 0), and a slice of no columns still
    # has a bucket to name.
    (lambda: opforge.scatter_add(S, I, 0), ValueError,
     r"scatter_add\(\): 'index' must hold values in \[0, dim_size\) = \[0, 0\), got 0 at position 0"),
    (lambda: opforge.scatter_add(S[:, :0], np.array([0, 2, 7, 1]), 3), ValueError, r"\[0, 3\), got 7 at position 2"),
    (lambda: opforge.scatter_add(S.astype(np.int32), I, 3), TypeError,
     r"scatter_add\(\): 'src' must have dtype in \[float32, float64, float16, bfloat16\], got int32"),
    (lambda: opforge.scatter_add(S[0, 0], I[:1], 3), ValueError, r"scatter_add\(\): 'src' must have rank >= 1"),
    (lambda: opforge.scatter_add(S, I, 2.5), TypeError, r"scatter_add\(\): 'dim_size' must be an int"),
    (lambda: opforge.scatter_add(S, I), TypeError, r"scatter_add\(\) missing required argument 'dim_size'"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_bad_index_in_every_framework():
    import jax.numpy as jnp

    import opforge.torch as ot

    message = r"scatter_add\(\): 'index' must hold values in \[0, dim_size\) = \[0, 2\), got 2 at position 0"
    with pytest.raises(ValueError, match=message):
        ot.scatter_add(torch.ones(3, 2), torch.tensor([2, 0, 7]), 2)
    with pytest.raises(ValueError, match=message):
        opforge.scatter_add(jnp.ones((3, 2)), jnp.array([2, 0, 7]), 2)


@pytest.mark.parametrize("framework", ["torch", "torch.compile", "jax.jit"])
def test_empty_result_still_checks_the_index(framework):
    # XLA drops a call whose results have no elements unless it is marked as having a side effect.
    import jax
    import jax.numpy as jnp

    import opforge.jax as oj
    import opforge.torch as ot

    message = r"scatter_add\(\): 'index' must hold values in \[0, dim_size\) = \[0, 0\), got 1 at position 0"
    if framework == "jax.jit":
        fn = jax.jit(lambda s, i: oj.scatter_add(s, i, 0))
        src, index = jnp.ones((3, 2)), jnp.array([1, 0, 1])
    else:
        fn = lambda s, i: ot.scatter_add(s, i, 0)  # noqa: E731
        fn = torch.compile(fn, fullgraph=True) if framework == "torch.compile" else fn
        src, index = torch.ones(3, 2), torch.tensor([1, 0, 1])
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(fn(src, index))
    if framework == "jax.jit":  # a valid index and an empty result: nothing to raise
        assert fn(jnp.ones((0, 2)), jnp.zeros(0, jnp.int32)).shape == (0, 2)


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_first_bad_position_of_a_long_index(restore_threads, index_dtype):
    # The check runs in parallel chunks; the message still names the first bad position.
    index = np.zeros(300_000, index_dtype)
    index[[200_003, 250_001, 299_999]] = [-5, 9, 7]
    for threads in (1, 2):
        opforge.set_num_threads(threads)
        with pytest.raises(ValueError, match=r"got -5 at position 200003$"):
            opforge.scatter_add(np.ones(300_000, np.float32), index, 3)
        with pytest.raises(ValueError, match=r"got -5 at position 200003$"):
            opforge.scatter_add_backward(np.ones(3, np.float32), index)
