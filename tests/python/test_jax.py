"""opforge.jax: every op with a reference, under jit, vmap and grad, against jax.numpy.

The JAX functions are derived from the declarations (bindings/jax, python/opforge/jax.py);
these tests hold every op to the same bar without naming one, except where a case needs an
op with or without some declared property.
"""

import importlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)  # float64 for check_grads and the references
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import opforge  # noqa: E402
import opforge.jax as oj  # noqa: E402
from opforge.testing import FLOAT_DTYPES, TOLERANCES, product_rounding, random  # noqa: E402

OPS_WITH_REFERENCE = [n for n in opforge._core.op_names()
                      if importlib.util.find_spec(f"opforge.references.{n}") is not None]
DIFFERENTIABLE = [n for n in OPS_WITH_REFERENCE if opforge._core.op(n).backward is not None]


def reference(name):
    return importlib.import_module(f"opforge.references.{name}")


def sample(name, rng, dtype, rows=5, cols=33):
    """The op's sample inputs at a small odd size, as jax arrays of `dtype`, plus attrs."""
    arrays, attrs = reference(name).sample(rng, rows=rows, cols=cols)
    # Float64 data becomes `dtype`; indices keep their integer type.
    return [jnp.asarray(a).astype(dtype) if np.asarray(a).dtype == np.float64 else jnp.asarray(a)
            for a in arrays], attrs


def float64_reference(name, args, attrs):
    """The op's jax.numpy reference on the exact values the op saw, in float64."""
    return reference(name).jax(*[a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a
                                 for a in args], **attrs)


def assert_close(got, want, dtype, extra=0.0):
    """got within the dtype's tolerance of want, plus `extra` (a bound per element)."""
    if not jnp.issubdtype(want.dtype, jnp.floating):  # bytes (ggml blocks): exact
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        return
    rtol, atol = TOLERANCES[dtype]
    assert got.dtype == jnp.dtype(dtype)
    g, w = np.asarray(got.astype(jnp.float64)), np.asarray(want)
    bad = ~((np.abs(g - w) <= atol + rtol * np.abs(w) + extra) | (g == w) | (np.isnan(g) & np.isnan(w)))
    assert not bad.any(), f"{bad.sum()} of {bad.size} off: got {g[bad][:5]}, want {w[bad][:5]}"


def rounding_beyond_tolerance(name, args, dtype, got):
    """linear_act on a GPU in the half types: cuBLASLt rounds x @ w^T to the dtype before its
    epilogue adds the bias (opforge.testing.product_rounding), times the activation's largest slope."""
    if name != "linear_act":
        return 0.0
    x, w = (np.asarray(a.astype(jnp.float64)) for a in args[:2])
    return 1.13 * product_rounding(got, x @ w.T, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("name", OPS_WITH_REFERENCE)
def test_jit_and_eager_match_reference(name, dtype, rng):
    declared = next(a for a in opforge._core.op(name).args if a["kind"].startswith("Tensor"))["dtypes"]
    takes_floats = any(d in declared for d in FLOAT_DTYPES)
    if (takes_floats and dtype not in declared) or (not takes_floats and dtype != "float32"):
        pytest.skip(f"{name} does not take {dtype}")  # (dequantize takes bytes: float32 results only)
    args, attrs = sample(name, rng, dtype)
    fn = getattr(oj, name)
    want = float64_reference(name, args, attrs)
    for got in (jax.jit(lambda *a: fn(*a, **attrs))(*args), fn(*args, **attrs)):
        assert_close(got, want, dtype, rounding_beyond_tolerance(name, args, dtype, got))


def test_integer_add_is_exact(rng):
    x = jnp.asarray(rng.integers(-1000, 1000, (4, 7)), dtype=jnp.int32)
    y = jnp.asarray(rng.integers(-1000, 1000, (7,)), dtype=jnp.int32)
    got = jax.jit(oj.add)(x, y)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), np.asarray(x + y))


def test_lowers_to_one_ffi_custom_call(rng):
    args, attrs = sample("rms_norm", rng, "float32")
    hlo = jax.jit(lambda *a: oj.rms_norm(*a, **attrs)).lower(*args).as_text()
    assert hlo.count("opforge_call") == 1
    assert "callback" not in hlo  # a custom call, not a host callback


@pytest.mark.parametrize("name", OPS_WITH_REFERENCE)
def test_vmap_matches_loop(name, rng):
    fn = getattr(oj, name)
    batch = [sample(name, rng, "float32", rows=3, cols=9) for _ in range(4)]
    attrs = batch[0][1]
    stacked = [jnp.stack([b[0][i] for b in batch]) for i in range(len(batch[0][0]))]
    want = jnp.stack([fn(*b[0], **attrs) for b in batch])
    # Every argument batched, then only the first (the rest shared).
    got = jax.jit(jax.vmap(lambda *a: fn(*a, **attrs)))(*stacked)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    shared = batch[0][0][1:]
    in_axes = (0,) + (None,) * len(shared)
    got = jax.vmap(lambda *a: fn(*a, **attrs), in_axes=in_axes)(stacked[0], *shared)
    want = jnp.stack([fn(b[0][0], *shared, **attrs) for b in batch])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", [n for n in OPS_WITH_REFERENCE if opforge._core.op(n).leading_dim_args])
def test_vmap_over_leading_dims_is_one_call(name, rng):
    """Ops declaring maps_over_leading_dims batch without a loop: one FFI call, no while."""
    args, attrs = sample(name, rng, "float32")
    stacked = [jnp.stack([a, a + 1]) for a in args]
    op = opforge._core.op(name)
    in_axes = tuple(0 if a["name"] in op.leading_dim_args else None
                    for a in op.args if a["kind"].startswith("Tensor"))
    call_args = [s if ax == 0 else a for s, a, ax in zip(stacked, args, in_axes)]
    hlo = jax.jit(jax.vmap(lambda *a: getattr(oj, name)(*a, **attrs), in_axes=in_axes)).lower(*call_args).as_text()
    assert hlo.count("opforge_call") == 1
    assert "while" not in hlo


def test_vmap_of_broadcast_add_aligns_batch(rng):
    x = jnp.asarray(rng.standard_normal((3, 4)))
    ys = jnp.asarray(rng.standard_normal((5, 4)))
    got = jax.vmap(oj.add, in_axes=(None, 0))(x, ys)
    np.testing.assert_allclose(np.asarray(got), np.asarray(x[None] + ys[:, None]), rtol=1e-12)


def test_jit_does_not_retrace(rng):
    traces = []

    @jax.jit
    def f(x, w):
        traces.append(1)
        return oj.rms_norm(x, w)

    x, w = sample("rms_norm", rng, "float32")[0]
    f(x, w)
    f(x + 1, w)
    assert len(traces) == 1
    f(jnp.ones((2, x.shape[1]), jnp.float32), w)  # new shape: one more trace
    assert len(traces) == 2


def differentiable_positions(name):
    """Positions, among the op's tensor arguments, of those its declaration makes differentiable
    (the others get a zero cotangent by declaration, e.g. rope's cos/sin tables)."""
    op = opforge._core.op(name)
    tensors = [a["name"] for a in op.args if a["kind"].startswith("Tensor")]
    return tuple(i for i, n in enumerate(tensors) if n in op.backward[1])


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_check_grads_float64(name, rng):
    args, attrs = sample(name, rng, "float64", rows=3, cols=7)
    wrt = differentiable_positions(name)

    def fn(*diff):
        full = list(args)
        for i, d in zip(wrt, diff):
            full[i] = d
        return getattr(oj, name)(*full, **attrs)

    check_grads(fn, [args[i] for i in wrt], order=1, modes=["rev"])


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_grad_matches_reference_grad(name, rng):
    args, attrs = sample(name, rng, "float64", rows=4, cols=9)
    wrt = differentiable_positions(name)
    ours = jax.grad(lambda *a: jnp.sum(jnp.sin(getattr(oj, name)(*a, **attrs))), argnums=wrt)
    theirs = jax.grad(lambda *a: jnp.sum(jnp.sin(reference(name).jax(*a, **attrs))), argnums=wrt)
    for g, w in zip(ours(*args), theirs(*args)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_per_example_grads_under_vmap(name, rng):
    batch = [sample(name, rng, "float64", rows=2, cols=5) for _ in range(3)]
    attrs = batch[0][1]
    loss = lambda *a: jnp.sum(getattr(oj, name)(*a, **attrs) ** 2)  # noqa: E731
    stacked = [jnp.stack([b[0][i] for b in batch]) for i in range(len(batch[0][0]))]
    got = jax.vmap(jax.grad(loss))(*stacked)
    want = jnp.stack([jax.grad(loss)(*b[0]) for b in batch])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-10)


def test_value_and_grad_under_jit(rng):
    x, w = [jnp.asarray(random(rng, s, "float64")) for s in [(3, 8), (8,)]]
    value, (gx, gw) = jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(oj.rms_norm(x, w) ** 2), argnums=(0, 1)))(x, w)
    ref_value, (rx, rw) = jax.value_and_grad(
        lambda x, w: jnp.sum(reference("rms_norm").jax(x, w) ** 2), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(rx), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.asarray(gw), np.asarray(rw), rtol=1e-9, atol=1e-12)


# Bad inputs fail while tracing, with the op's own message, under jit as eagerly.
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("call, error, message", [
    (lambda: oj.rms_norm(jnp.ones((2, 4)), jnp.ones(3)), ValueError,
     r"rms_norm\(\): 'weight' must have shape \[4\], got \[3\]"),
    (lambda: oj.rms_norm(jnp.ones((2, 4), jnp.int32), jnp.ones(4, jnp.int32)), TypeError,
     r"rms_norm\(\): 'x' must have dtype in \[float32, float64, float16, bfloat16\], got int32"),
    (lambda: oj.add(jnp.ones(3, jnp.float32), jnp.ones(3, jnp.float64)), TypeError,
     r"add\(\): 'y' must have dtype float32 like 'x', got float64"),
    (lambda: oj.add(jnp.ones((2, 3)), jnp.ones((4,))), ValueError, r"add\(\): 'x' of shape \[2, 3\] and 'y'"),
    (lambda: oj.add(jnp.ones(3), 1.0), TypeError, r"add\(\): 'y' must be an array, got float"),
    (lambda: oj.rms_norm(jnp.ones((2, 4))), TypeError, r"rms_norm\(\): missing a required argument: 'weight'"),
    (lambda: oj.rms_norm(jnp.ones((2, 4)), jnp.ones(4), eps="a"), TypeError, r"rms_norm\(\): 'eps' must be a float"),
    (lambda: oj.rms_norm(jnp.ones((2, 4)), jnp.ones(4), eps=-1.0), ValueError, r"rms_norm\(\): 'eps' must be >= 0"),
    (lambda: oj.rms_norm(jnp.ones((2, 4)), jnp.ones(4), eps=jnp.ones(4)), TypeError,
     r"rms_norm\(\): 'eps' must be a float"),  # under jit: "known when tracing", a traced array
    (lambda: oj.rms_norm(jnp.ones((2, 4)), jnp.ones(4), eps=10**400), ValueError,
     r"rms_norm\(\): 'eps' is out of the float range"),
    (lambda: oj.scatter_add(jnp.ones((2, 3)), jnp.zeros(2, jnp.int32), 2.0), TypeError,
     r"scatter_add\(\): 'dim_size' must be an int, got float"),
    (lambda: oj.scatter_add(jnp.ones((2, 3)), jnp.zeros(2, jnp.int32), 2**70), ValueError,
     r"scatter_add\(\): 'dim_size' must fit in 64 bits"),
    (lambda: oj.gelu(jnp.ones(3), approximate=None), TypeError, r"gelu\(\): 'approximate' must be a str, got NoneType"),
    (lambda: oj.gelu(jnp.ones(3), approximate="\udcff"), ValueError,
     r"gelu\(\): 'approximate' is not valid Unicode text"),
    (lambda: oj.scatter_add(jnp.ones((6, 4), jnp.float32), jnp.zeros(6, jnp.int32), 2**62), ValueError,  # XLA aborts
     r"scatter_add\(\): the result would have shape \[4611686018427387904, 4\] \(float32\), 2\^63 bytes or more"),
    (lambda: oj.add(jnp.ones(3, jnp.int16), jnp.ones(3, jnp.int16)), TypeError,
     r"add\(\): 'x' must have dtype in \[float32, .*, int64\], got int16"),
    (lambda: oj.relu(jnp.ones(3, jnp.complex64)), TypeError,
     r"relu\(\): 'x' must have dtype in \[float32, float64, float16, bfloat16\], got complex64"),
])
def test_bad_input_raises_at_trace_time(call, error, message, jit):
    with pytest.raises(error, match=message):
        jax.jit(call)() if jit else call()


@pytest.mark.parametrize("fn", [
    lambda x: oj.relu_backward(x, x).sum(),
    lambda x: oj.matmul_q(x, oj.quantize_q8_0(jnp.ones((4, 32), jnp.float32)), "q8_0").sum(),
    lambda x: oj.dequantize(oj.quantize_q8_0(x), "q8_0").sum(),  # integers between: not a zero gradient
], ids=["relu_backward", "matmul_q", "quantize_q8_0"])
def test_grad_through_an_op_without_backward_names_it(fn):
    x = jnp.ones((2, 32), jnp.float32)
    with pytest.raises(RuntimeError, match=r"\(\) is not differentiable: its declaration names no backward op"):
        jax.grad(fn)(x)
    with pytest.raises(RuntimeError, match=r"is not differentiable"):
        jax.jvp(fn, (x,), (x,))
    jax.jit(jax.vmap(fn))(x[None])  # undifferentiated: fine


@pytest.mark.parametrize("transform", ["grad_of_grad", "hessian"])
def test_second_derivatives_name_the_op(transform):
    """Backward ops have no backward op: differentiating a gradient raises opforge's error (XLA's
    would name only its FFI target), whichever rule JAX differentiates first."""
    x = jnp.array([0.5, -1.0])
    run = {"grad_of_grad": lambda: jax.grad(lambda v: jax.grad(lambda u: oj.gelu(u).sum())(v).sum())(x),
           "hessian": lambda: jax.hessian(lambda v: oj.add_one(v).sum())(x)}[transform]
    message = (r"(gelu|add_one)\(\) is not differentiable: a second derivative or forward-mode AD would "
               r"differentiate (gelu|add_one)_backward\(\), which has no backward op")
    with pytest.raises(RuntimeError, match=message):
        run()


def test_attributes_are_static_values():
    """An attribute may be any scalar float()/operator.index() takes, NumPy's and concrete JAX
    ones too, but not a value traced under jit (an FFI call's attributes are compile-time
    constants); 2.0 for an int is refused even after a call with 2 was cached."""
    x, w, index = jnp.ones((2, 4)), jnp.ones(4), jnp.array([0, 1])
    want = oj.rms_norm(x, w, eps=1e-3)
    for eps in (np.float32(1e-3), jnp.float32(1e-3), np.array(1e-3)):
        np.testing.assert_allclose(oj.rms_norm(x, w, eps=eps), want, rtol=1e-6)
    with pytest.raises(TypeError, match=r"rms_norm\(\): 'eps' must be a float known when tracing \(attributes are "
                                        r"static\), got a traced value"):
        jax.jit(lambda e: oj.rms_norm(x, w, eps=e))(1e-3)
    np.testing.assert_array_equal(oj.scatter_add(x, index, np.int64(3)), oj.scatter_add(x, index, 3))
    table = jnp.ones((3, 2))
    rope_x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 2, 4)))
    np.testing.assert_array_equal(oj.rope(rope_x, table, table, np.bool_(True)), oj.rope(rope_x, table, table, True))
    with pytest.raises(TypeError, match="must be an int, got float"):
        oj.scatter_add(x, index, 3.0)


def test_abi_check_names_both_versions(monkeypatch):
    monkeypatch.setattr(oj.jaxlib, "__version__", "0.0.1")
    with pytest.raises(ImportError, match=r"built against jaxlib .* running jaxlib is 0\.0\.1"):
        oj._check_abi()


def test_functions_carry_schema_signatures():
    import inspect

    for name in opforge._core.op_names():
        fn = getattr(oj, name)
        assert opforge._core.op(name).schema in fn.__doc__
        assert list(inspect.signature(fn).parameters) == [a["name"] for a in opforge._core.op(name).args]
