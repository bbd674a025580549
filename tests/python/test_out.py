"""out=: opforge.<op> writes its results into the caller's arrays (bindings/python/out_arrays.cc).
Every op, from NumPy and torch, must give the bits it gives without out=, into the very arrays
it was handed (filled with NaN first, so an element left unwritten shows); elementwise ops also
in place; and every way an out= array can be wrong is a typed error naming the op and 'out'."""

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import opforge  # noqa: E402
from op_samples import CORE, OPS, sample  # noqa: E402

ELEMENTWISE = [n for n in OPS if CORE[n].elementwise]


def poisoned_like(a):
    """An array shaped and typed like `a` whose every element differs from what a kernel writes."""
    if isinstance(a, torch.Tensor):
        return torch.full_like(a, float("nan")) if a.is_floating_point() else torch.full_like(a, 77)
    return np.full_like(a, np.nan) if np.issubdtype(a.dtype, np.floating) else np.full_like(a, 77)


def as_tuple(result):
    return result if isinstance(result, tuple) else (result,)


def equal(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))
    return np.array_equal(a, b, equal_nan=np.issubdtype(a.dtype, np.floating))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("name", OPS)
def test_every_op_writes_its_results_into_out(name, kind, rng):
    tensors, attrs = sample(name, rng, "float32", rows=5, cols=64)
    args = [t.detach().numpy() if kind == "numpy" else t.detach() for t in tensors]
    function = getattr(opforge, name)
    want = as_tuple(function(*args, **attrs))  # the results it allocates itself
    out = tuple(poisoned_like(w) for w in want)
    got = function(*args, **attrs, out=out if len(out) > 1 else out[0])
    assert all(g is o for g, o in zip(as_tuple(got), out))  # the caller's arrays, returned as given
    for o, w in zip(out, want):
        assert type(o) is type(w) and o.shape == w.shape and o.dtype == w.dtype
        assert equal(o, w), name
    # A tuple comes back as a tuple, even for one result (NumPy's ufuncs answer alike).
    again = tuple(poisoned_like(w) for w in want)
    got = function(*args, **attrs, out=again)
    assert isinstance(got, tuple) and all(g is o for g, o in zip(got, again))
    assert all(equal(o, w) for o, w in zip(again, want))


def test_none_in_out_allocates_that_result(rng):
    tensors, attrs = sample("layer_norm_backward", rng, "float32", rows=6, cols=40)
    args = [t.detach().numpy() for t in tensors]
    want = opforge.layer_norm_backward(*args, **attrs)
    grad_x = poisoned_like(want[0])
    got = opforge.layer_norm_backward(*args, **attrs, out=[grad_x, None, None])
    assert got[0] is grad_x
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert opforge.add(args[1], args[1], out=None).shape == args[1].shape  # None: no out=


def test_out_may_be_broadcast_and_empty_results(rng):
    x = rng.standard_normal((3, 1)).astype(np.float32)
    y = rng.standard_normal(5).astype(np.float32)
    out = np.full((3, 5), np.nan, np.float32)
    assert opforge.add(x, y, out=out) is out
    np.testing.assert_array_equal(out, x + y)
    empty = np.empty((0, 5), np.float32)
    assert opforge.mul(empty, y, out=empty.copy()).shape == (0, 5)
    assert opforge.rms_norm(empty, np.ones(5, np.float32), out=np.empty((0, 5), np.float32)).shape == (0, 5)


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise_ops_take_out_in_any_dense_order(name, rng):
    """Elementwise kernels see views reordered to the result's layout, so a transposed out works
    whatever the inputs' layout; it holds the same values as a row-major one."""
    tensors, attrs = sample(name, rng, "float32", rows=7, cols=33)
    args = [t.detach().numpy() for t in tensors]
    want = getattr(opforge, name)(*args, **attrs)
    column_major = np.full(want.shape[::-1], np.nan, want.dtype).T
    assert getattr(opforge, name)(*args, **attrs, out=column_major) is column_major
    np.testing.assert_array_equal(column_major, want)
    transposed = [np.ascontiguousarray(a.T).T for a in args]  # column-major inputs, row-major out
    row_major = poisoned_like(want)
    getattr(opforge, name)(*transposed, **attrs, out=row_major)
    np.testing.assert_array_equal(row_major, want)


@pytest.mark.parametrize("size", [1, 7, 33, 1000, 300_007])
@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise_ops_run_in_place(name, size, rng):
    """out= may be an elementwise input itself; sizes from one element to several threads' worth,
    odd ones leaving SIMD tails."""
    tensors, attrs = sample(name, rng, "float32", rows=1, cols=size)
    args = [t.detach().numpy().copy() for t in tensors]
    want = getattr(opforge, name)(*args, **attrs)
    for i, arg_name in enumerate(a["name"] for a in CORE[name].args if a["kind"].startswith("Tensor")):
        if arg_name not in CORE[name].elementwise or args[i].shape != want.shape or args[i].dtype != want.dtype:
            continue
        written = [a.copy() for a in args]
        assert getattr(opforge, name)(*written, **attrs, out=written[i]) is written[i]
        np.testing.assert_array_equal(written[i], want, err_msg=f"{name}: out={arg_name}")


def test_in_place_with_the_same_array_twice_and_transposed(rng):
    x = rng.standard_normal((9, 31)).astype(np.float32)
    want = x + x
    assert opforge.add(x, x, out=x) is x
    np.testing.assert_array_equal(x, want)
    t = np.asfortranarray(rng.standard_normal((9, 31)).astype(np.float32))
    y = rng.standard_normal(31).astype(np.float32)
    want = t * y
    opforge.mul(t, y, out=t)
    np.testing.assert_array_equal(t, want)
    s = torch.from_numpy(rng.standard_normal((4, 50)).astype(np.float32))
    want = torch.relu(s)
    assert opforge.relu(s, out=s) is s
    assert torch.equal(s, want)


def test_torch_out_is_seen_by_autograd_as_written(rng):
    """A tensor written through out= gets its version counter bumped, as by torch's own in-place
    writes: autograd then refuses a value it saved before the write instead of using it silently."""
    w = torch.randn(5, requires_grad=True)
    saved = torch.randn(5)
    loss = (w * saved).sum()  # saves `saved` for w's gradient
    opforge.add(torch.ones(5), torch.ones(5), out=saved)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_torch_out_under_no_grad(rng):
    x = torch.randn(3, 8, requires_grad=True)
    out = torch.empty(3, 8)
    with torch.no_grad():
        assert opforge.silu(x, out=out) is out
    assert torch.equal(out, opforge.silu(x.detach()))


def test_numpy_out_from_jax_inputs(rng):
    jnp = pytest.importorskip("jax.numpy")
    x = rng.standard_normal((2, 6)).astype(np.float32)
    out = np.full((2, 6), np.nan, np.float32)
    assert opforge.add(jnp.asarray(x), jnp.asarray(x), out=out) is out
    np.testing.assert_array_equal(out, x + x)


def message(text):
    return "^" + re.escape(text) + "$"


def test_wrong_out_arrays_are_typed_errors(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    y = rng.standard_normal(5).astype(np.float32)
    w = np.ones(5, np.float32)
    with pytest.raises(ValueError, match=message("add(): 'out' must have shape [3, 5], got [3, 4]")):
        opforge.add(x, y, out=np.empty((3, 4), np.float32))
    with pytest.raises(TypeError, match=message("add(): 'out' must have dtype float32, got float64")):
        opforge.add(x, y, out=np.empty((3, 5)))
    for out in np.empty((3, 5), np.complex64), torch.empty((3, 5), dtype=torch.complex64):
        with pytest.raises(TypeError, match=message("add(): 'out' must have dtype float32, got complex64")):
            opforge.add(x, y, out=out)
    with pytest.raises(TypeError, match=message(
            "add(): 'out' is a ndarray with dtype >f4 on cpu, which opforge cannot write to")):
        opforge.add(x, y, out=np.empty((3, 5), ">f4"))
    with pytest.raises(ValueError, match=message("add(): 'out' is a read-only array")):
        opforge.add(x, y, out=np.broadcast_to(np.empty(5, np.float32), (3, 5)))
    with pytest.raises(ValueError, match=message(
            "add(): 'out' must be dense (every element once, in one block, in some order of its dimensions), "
            "got strides [10, 2] for shape [3, 5]")):
        opforge.add(x, y, out=np.empty((3, 10), np.float32)[:, ::2])
    with pytest.raises(ValueError, match=message(
            "rms_norm(): 'out' must be row-major (C-contiguous), got strides [1, 3] for shape [3, 5]")):
        opforge.rms_norm(x, w, out=np.empty((5, 3), np.float32).T)
    with pytest.raises(TypeError, match=message("add(): 'out' must hold 1 array (one per result), got a tuple of 2")):
        opforge.add(x, y, out=(np.empty((3, 5), np.float32),) * 2)
    with pytest.raises(TypeError, match=message(
            "rms_norm_backward(): 'out' must be a tuple of 2 arrays (one per result), got ndarray")):
        opforge.rms_norm_backward(x, x, w, out=np.empty((3, 5), np.float32))
    with pytest.raises(TypeError, match=message(
            "add(): 'out' must be a writable array (NumPy, torch, CuPy, or any DLPack or buffer-protocol object), "
            "got int")):
        opforge.add(x, y, out=3)
    with pytest.raises(TypeError, match=message(
            "add(): 'out[0]' must be a writable array (NumPy, torch, CuPy, or any DLPack or buffer-protocol object), "
            "got float")):
        opforge.add(x, y, out=[1.0])


def test_out_sharing_memory_is_refused(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    w = np.ones(5, np.float32)
    with pytest.raises(ValueError, match=message(
            "rms_norm(): 'out' shares memory with 'x'; out= may not overlap an input (kernels may read an input "
            "after writing results)")):
        opforge.rms_norm(x, w, out=x)
    buffer = rng.standard_normal(40).astype(np.float32)
    with pytest.raises(ValueError, match=message(
            "relu(): 'out' shares memory with 'x'; out= may be an elementwise input itself (in place), not "
            "overlap one otherwise")):
        opforge.relu(buffer[:30], out=buffer[5:35])
    square = rng.standard_normal((4, 4)).astype(np.float32)
    with pytest.raises(ValueError, match=r"^relu\(\): 'out' shares memory with 'x'; out= may be an elementwise"):
        opforge.relu(square, out=square.T)  # the same elements, in another order
    memory = rng.standard_normal(15).astype(np.float32)
    column = memory[:3].reshape(3, 1)  # broadcast over the columns of a result that covers it
    with pytest.raises(ValueError, match=r"^add\(\): 'out' shares memory with 'y'; out= may be an elementwise"):
        opforge.add(x, column, out=memory.reshape(3, 5))
    tensors, attrs = sample("layer_norm_backward", rng, "float32", rows=4, cols=8)
    args = [t.detach().numpy() for t in tensors]
    grads = opforge.layer_norm_backward(*args, **attrs)
    shared = np.empty_like(grads[1])
    with pytest.raises(ValueError, match=message("layer_norm_backward(): 'out[2]' shares memory with 'out[1]'")):
        opforge.layer_norm_backward(*args, **attrs, out=(None, shared, shared))


def test_out_refuses_jax_and_autograd(rng):
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(TypeError, match=message(
            "add(): 'x' is a torch tensor that requires grad, and out= does not support autograd (as torch's own "
            "out= variants): call it under torch.no_grad(), or without out=")):
        opforge.add(x, x, out=torch.empty(4))
    with pytest.raises(TypeError, match=r"^add\(\): 'out' is a torch tensor that requires grad, and out="):
        opforge.add(x.detach(), x.detach(), out=torch.empty(4, requires_grad=True))
    # Meta tensors: torch's out variant checks them, as torch's own ops (nothing to write); a
    # meta out beside arrays of another kind takes the generic path, which must say why it cannot.
    meta = torch.empty(4, device="meta")
    assert opforge.relu(meta, out=meta) is meta
    with pytest.raises(ValueError, match=message("relu(): 'out' must have shape [4], got [5]")):
        opforge.relu(meta, out=torch.empty(5, device="meta"))
    with pytest.raises(RuntimeError, match=r"^relu\(\): 'out' is on meta but 'x' is on cpu"):
        opforge.relu(torch.ones(4), out=meta)
    with pytest.raises(TypeError, match=r"^relu\(\): 'out' is a Tensor with dtype float32 on meta, which opforge "
                       r"cannot write to \(out= with arrays of different kinds writes CPU or CUDA memory: for meta or "
                       r"forge tensors, or under torch.compile, pass torch tensors only, inputs and out\)$"):
        opforge.relu(np.ones(4, np.float32), out=meta)
    jax = pytest.importorskip("jax")
    a = jax.numpy.ones(4, jax.numpy.float32)
    with pytest.raises(TypeError, match=message(
            "add(): 'out' is a JAX array, which cannot be written (JAX arrays are immutable): call it without out= "
            "and use the result")):
        opforge.add(a, a, out=jax.numpy.zeros(4, jax.numpy.float32))
    with pytest.raises(TypeError, match=re.escape(  # JAX may append a note on its traceback filtering
            "add(): out= cannot be used while JAX traces (jit, grad, vmap): JAX arrays are immutable; use the "
            "result")):
        jax.jit(lambda v: opforge.add(v, v, out=np.empty(4, np.float32)))(a)
