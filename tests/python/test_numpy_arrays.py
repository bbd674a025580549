"""NumPy arrays through the generic adapter's fast path (NumPy's C API in, PyArray_NewFromDescr out;
bindings/python/numpy_arrays.cc), and opforge.<op> as a vectorcall Function
(bindings/python/function.cc). References are NumPy's own results on fresh random data."""

import gc
import inspect
import pydoc
import sys
import threading
import weakref

import numpy as np
import pytest

import opforge

# Every dtype the NumPy path maps, with the NumPy spellings that reach it (C's int types differ
# in type number, not in meaning).
DTYPES = [np.float32, np.float64, np.float16, np.intc, np.int_, np.longlong]


def sample(rng, shape, dtype):
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -50), min(info.max, 50), size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def layouts(rng, dtype):
    """(name, x, y): inputs of one broadcast-compatible shape pair in many memory layouts."""
    base = sample(rng, (5, 7), dtype)
    other = sample(rng, (5, 7), dtype)
    item = np.dtype(dtype).itemsize
    yield "contiguous", base, other
    yield "transposed", base.T, other.T
    yield "reversed", base[::-1, ::-2], other[::-1, ::-2]
    yield "fortran", np.asfortranarray(base), other
    yield "broadcast row", base, sample(rng, (7,), dtype)
    yield "stride 0", np.broadcast_to(sample(rng, (1, 7), dtype), (5, 7)), other
    yield "zero-d", np.array(sample(rng, (), dtype)), np.array(sample(rng, (), dtype))
    yield "empty", base[:0], other[:0]
    readonly = base.copy()
    readonly.flags.writeable = False
    yield "read-only", readonly, other

    class Sub(np.ndarray):
        pass

    yield "subclass", base.view(Sub), other
    if item > 1:  # a data pointer off the element size (NumPy allows it; opforge reads it as given)
        raw = np.zeros(base.nbytes + 1, np.uint8)[1:].view(dtype).reshape(base.shape)
        raw[...] = base
        yield "misaligned", raw, other


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name + "/" + np.dtype(d).char)
def test_add_in_every_layout_matches_numpy(rng, dtype):
    for name, x, y in layouts(rng, dtype):
        got = opforge.add(x, y)
        expected = np.add(x, y, dtype=dtype)
        assert type(got) is np.ndarray, name
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        np.testing.assert_array_equal(got, expected, err_msg=name)


def test_uint8_blocks_in_and_out(rng):
    """The ggml formats' blocks are uint8 arrays: a result of quantize, an input of dequantize."""
    x = rng.standard_normal((4, 64)).astype(np.float32)
    q = opforge.quantize_q8_0(x)
    assert type(q) is np.ndarray and q.dtype == np.uint8 and q.shape == (4, 2 * 34)
    readonly = q.copy()
    readonly.flags.writeable = False
    for blocks in [q, readonly, np.asfortranarray(q)[::1]]:
        back = opforge.dequantize(blocks, "q8_0")
        assert back.dtype == np.float32 and back.shape == x.shape
        step = np.abs(x.reshape(4, 2, 32)).max(axis=2, keepdims=True) / 127  # a block's scale
        # Half a step, plus the scale's float16 rounding (2^-11 of it) times up to 127 steps.
        assert (np.abs(back - x).reshape(4, 2, 32) <= step * (0.5 + 127 * 2.0**-11)).all()


def test_results_own_their_memory(rng):
    # Past 4 KiB a result is opforge's aligned memory, which a capsule owns.
    x, y = sample(rng, (33, 32), np.float32), sample(rng, (33, 32), np.float32)
    expected = x + y
    got = opforge.add(x, y)
    del x, y
    gc.collect()
    np.testing.assert_array_equal(got, expected)
    assert got.flags.writeable and got.flags.c_contiguous and not got.flags.owndata
    base = got.base
    holders = sys.getrefcount(base) - 2  # less this name and getrefcount's argument
    assert type(base).__name__ == "PyCapsule" and holders == 1  # the array alone
    del base
    got[0, 0] = 100.0  # writes land in the result, which nothing else sees
    assert got[0, 0] == 100.0
    view = got[1:]
    del got
    gc.collect()
    np.testing.assert_array_equal(view, expected[1:])  # a view keeps the memory alive


@pytest.mark.parametrize("shape, dtype", [((), np.float32), ((3, 4), np.float64), ((32, 32), np.float32),
                                          ((2, 0), np.int64), ((7, 5, 3), np.int32)])
def test_small_results_are_numpys_own_memory(shape, dtype, rng):
    """Results of at most 4 KiB are allocated by NumPy (its cache of small blocks) and own it."""
    x = sample(rng, shape, dtype)
    got = opforge.add(x, x)
    assert got.flags.owndata and got.base is None and got.flags.writeable
    assert got.dtype == dtype and got.shape == x.shape
    np.testing.assert_array_equal(got, x + x)
    first, second = opforge.add(x, x), opforge.add(x, x)
    assert first.size == 0 or not np.shares_memory(first, second)


def test_small_results_keep_the_inputs_layout(rng):
    x = sample(rng, (5, 7, 3), np.float32).transpose(2, 0, 1)  # 420 bytes: a small result
    got = opforge.add(x, x)
    assert got.flags.owndata and got.strides == x.strides
    np.testing.assert_array_equal(got, x + x)
    y = sample(rng, (3, 5), np.float32).T[::-1]  # steps backwards: the result keeps the order, not the sign
    got = opforge.add(y, y)
    assert got.flags.owndata and got.strides == (4, 20)
    np.testing.assert_array_equal(got, y + y)


def test_a_result_keeps_the_inputs_layout(rng):
    x = sample(rng, (6, 9), np.float32).T
    got = opforge.add(x, x)
    assert got.flags.f_contiguous and got.strides == x.strides
    np.testing.assert_array_equal(got, x + x)


@pytest.mark.parametrize("make, message", [
    (lambda x: x.astype(">f4"),
     r"add\(\): 'x' is a ndarray with dtype >f4 on cpu, which opforge cannot read without a copy"),
    (lambda x: np.ndarray((3,), np.float32, buffer=np.zeros(20, np.uint8), strides=(5,)),
     r"add\(\): 'x' is a ndarray with dtype float32 on cpu, which opforge cannot read without a copy"),
    (lambda x: x.astype(np.complex64), r"add\(\): 'x' must have dtype in \[float32, .*int64\], got complex64$"),
    (lambda x: x.astype(np.uint16), r"add\(\): 'x' must have dtype in \[float32, .*int64\], got uint16$"),
    (lambda x: memoryview(x.astype(np.int16)),
     r"add\(\): 'x' must have dtype in \[float32, .*int64\], got DLPack dtype \(code 0, bits 16, lanes 1\)$"),
    (lambda x: x.astype(object), r"add\(\): 'x' is a ndarray with dtype object on cpu"),
    (lambda x: x.astype(np.float64), r"add\(\): 'y' must have dtype float64 like 'x', got float32"),
    (lambda x: x.astype(np.int8), r"add\(\): 'x' must have dtype in \[float32, .*int64\], got int8$"),
    (lambda x: x.astype(np.bool_), r"add\(\): 'x' must have dtype in \[float32, .*int64\], got bool$"),
])
def test_arrays_the_fast_path_leaves_get_the_generic_errors(make, message):
    x = np.ones(3, np.float32)
    with pytest.raises(TypeError, match=message):
        opforge.add(make(x), x)


def test_function_object():
    add = opforge.add
    assert type(add) is opforge._core.Function and callable(add)
    assert repr(add) == "<opforge function add>"
    assert add.__name__ == add.__qualname__ == "add" and add.__module__ == "opforge"
    signature = "(x: 'Array', y: 'Array', *, out: 'Array | None' = None) -> 'Array'"
    assert str(inspect.signature(add)) == signature
    assert inspect.isroutine(add) and add.op.name == "add"
    assert "add" + signature in pydoc.render_doc(add, renderer=pydoc.plaintext)
    assert weakref.ref(add)() is add

    class Holder:
        method = opforge.add  # like a builtin function, not bound to the instance

    ones = np.ones(2, np.float32)
    np.testing.assert_array_equal(Holder().method(ones, ones), [2, 2])


@pytest.mark.parametrize("call, error, message", [
    (lambda f, a: f(a), TypeError, r"^add\(\) missing required argument 'y'$"),
    (lambda f, a: f(a, a, a), TypeError, r"^add\(\) takes 2 arguments but 3 were given$"),
    (lambda f, a: f(a, z=a), TypeError, r"^add\(\) got an unexpected keyword argument 'z'$"),
    (lambda f, a: f(a, a, x=a), TypeError, r"^add\(\) got multiple values for argument 'x'$"),
    (lambda f, a: f(a, a[:2]), ValueError, r"^add\(\): 'x' of shape \[3\] and 'y' of shape \[2\] cannot be broadcast"),
    (lambda f, a: f(a, [1.0]), TypeError, r"^add\(\): 'y' must be an array"),
])
@pytest.mark.parametrize("entry", ["function", "op"])
def test_binding_and_errors_alike_through_function_and_op(entry, call, error, message):
    f = opforge.add if entry == "function" else opforge._core.op("add")
    a = np.ones(3, np.float32)
    with pytest.raises(error, match=message):
        call(f, a)
    np.testing.assert_array_equal(f(y=a, x=a), a + a)  # the failed call left nothing behind
    np.testing.assert_array_equal(f(*[a], **{"y": a}), a + a)


def test_errors_stay_with_their_thread():
    """A failed call's error is kept per thread until raised: threads failing differently at once
    each get their own message."""
    shapes = {"short": 2, "long": 5}
    failures = []

    def work(kind):
        a = np.ones(3, np.float32)
        for _ in range(300):
            try:
                opforge.add(a, np.ones(shapes[kind], np.float32))
            except ValueError as e:
                if f"of shape [{shapes[kind]}]" not in str(e):
                    failures.append(str(e))
            else:
                failures.append("no error")
            np.testing.assert_array_equal(opforge.add(a, a), a + a)

    threads = [threading.Thread(target=work, args=(k,)) for k in ["short", "long"] * 2]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not failures, failures[:3]
