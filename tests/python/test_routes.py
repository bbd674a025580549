"""opforge.<op> routes a framework's own values to that framework's adapter (bindings/python/
function.cc): torch tensors to opforge.torch.<op> (autograd, torch.compile, meta tensors), JAX
tracers to opforge.jax.<op> (jit, grad, vmap), and JAX arrays alone there too (one compiled
call). Anything else, mixtures included, takes the generic DLPack path. Each route is held to
an independent reference, not to the adapter it calls, and to the same bits as that adapter.
"""

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import opforge  # noqa: E402
import opforge.jax as oj  # noqa: E402
import opforge.torch as ot  # noqa: E402
from op_samples import (CORE, OPS, WITH_REFERENCE, check_grads_against_reference, reference,  # noqa: E402
                        tensor_names)
from opforge.testing import TOLERANCES  # noqa: E402

DIFFERENTIABLE = [n for n in OPS if CORE[n].backward and n in WITH_REFERENCE]


def test_every_op_has_both_routes():
    for name in OPS:
        function = getattr(opforge, name)
        assert function._torch_route is getattr(ot, name), name
        assert function._jax_route is getattr(oj, name), name


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_torch_tensors_get_autograd(name, rng):
    """Gradients against the reference's in float64; the forward is the torch op's, bit for bit."""
    tensors, attrs, got = check_grads_against_reference(getattr(opforge, name), name, rng)
    assert torch.equal(got.detach(), getattr(ot, name)(*[t.detach() for t in tensors], **attrs))


def test_torch_call_takes_keywords_and_defaults(rng):
    x = torch.from_numpy(rng.standard_normal((3, 16)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal(16).astype(np.float32))
    want = reference("rms_norm").torch(x.double(), w.double(), eps=1e-5)
    got = opforge.rms_norm(weight=w, x=x, eps=1e-5)
    torch.testing.assert_close(got.double(), want, rtol=TOLERANCES["float32"][0], atol=TOLERANCES["float32"][1])
    assert torch.equal(opforge.gelu(x), opforge.gelu(x, approximate="none"))


def test_meta_tensors_get_the_shape_rule():
    out = opforge.add(torch.ones(3, 1, device="meta"), torch.ones(5, device="meta"))
    assert out.device.type == "meta" and out.shape == (3, 5)


def test_torch_errors_keep_their_type_and_wording():
    with pytest.raises(ValueError, match=r"rms_norm\(\): 'weight' must have shape \[4\], got \[3\]"):
        opforge.rms_norm(torch.ones(2, 4), torch.ones(3))
    with pytest.raises(TypeError, match=r"add\(\) got an unexpected keyword argument 'z'"):
        opforge.add(torch.ones(2), torch.ones(2), z=1)


@pytest.mark.parametrize("kind", ["numpy", "torch", "jax", "jax tracer"])
def test_wrong_arguments_get_one_error_whatever_the_arrays(kind):
    """The call is bound by the schema before it is routed: the same TypeError, word for word,
    whichever framework's arrays (or tracers) it was given."""
    make = {"numpy": np.ones, "torch": torch.ones, "jax": jnp.ones, "jax tracer": jnp.ones}[kind]
    calls = {
        "add() missing required argument 'y'": lambda x: opforge.add(x),
        "add() takes 2 arguments but 3 were given": lambda x: opforge.add(x, x, x),
        "add() got an unexpected keyword argument 'z'": lambda x: opforge.add(x, x, z=x),
        "add() got multiple values for argument 'x'": lambda x: opforge.add(x, x=x),
        "rms_norm() missing required argument 'weight'": lambda x: opforge.rms_norm(x, eps=1e-3),
    }
    for message, call in calls.items():
        with pytest.raises(TypeError) as error:
            if kind == "jax tracer":
                jax.jit(call)(make(4))
            else:
                call(make(4))
        assert str(error.value) == message, (kind, message)


def test_mixtures_take_the_generic_path(rng):
    x = rng.standard_normal((2, 5)).astype(np.float32)
    t = torch.from_numpy(rng.standard_normal((2, 5)).astype(np.float32))
    got = opforge.add(t, x)  # the first array's kind comes back, as before routes existed
    assert isinstance(got, torch.Tensor)
    np.testing.assert_array_equal(got.numpy(), t.numpy() + x)
    # The generic path cannot carry autograd, so it refuses to drop a gradient.
    with pytest.raises(TypeError, match=r"add\(\): 'x' is a torch tensor that requires grad"):
        opforge.add(t.clone().requires_grad_(), x)


def test_a_cleared_route_falls_back_to_the_generic_path(rng):
    t = torch.from_numpy(rng.standard_normal(7).astype(np.float32))
    function = opforge.relu
    route = function._torch_route
    try:
        function._torch_route = None
        with pytest.raises(TypeError, match=r"relu\(\): 'x' is a torch tensor that requires grad"):
            function(t.clone().requires_grad_())
        np.testing.assert_array_equal(function(t).numpy(), np.maximum(t.numpy(), 0))
    finally:
        function._torch_route = route
    assert function(t.clone().requires_grad_()).requires_grad


def test_torch_compile_fullgraph_puts_the_torch_op_in_the_graph(rng):
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = []

    def backend(gm, example_inputs):
        def keep(graph, _):
            graphs.append(graph.code)
            return make_boxed_func(graph.forward)
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)

    torch._dynamo.reset()
    x = torch.from_numpy(rng.standard_normal((4, 32)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal(32).astype(np.float32)).requires_grad_()
    fn = torch.compile(lambda x, w: opforge.rms_norm(x, w, eps=1e-6).sin().sum(), backend=backend, fullgraph=True)
    fn(x, w).backward()
    w_ref = w.detach().double().requires_grad_()
    reference("rms_norm").torch(x.double(), w_ref, eps=1e-6).sin().sum().backward()
    torch.testing.assert_close(w.grad.double(), w_ref.grad, rtol=1e-4, atol=1e-4)
    assert any("torch.ops.opforge.rms_norm" in g for g in graphs), graphs
    assert any("torch.ops.opforge.rms_norm_backward" in g for g in graphs), graphs


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_torch_export_records_the_torch_op(strict, rng):
    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.from_numpy(rng.standard_normal(16).astype(np.float32)))

        def forward(self, x):
            return opforge.rms_norm(x, self.w, eps=1e-6) * 2

    model, x = Norm(), torch.from_numpy(rng.standard_normal((4, 16)).astype(np.float32))
    exported = torch.export.export(model, (x,), strict=strict)
    targets = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert torch.ops.opforge.rms_norm.default in targets, targets
    assert torch.equal(exported.module()(x), model(x))


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_jax_tracers_take_opforge_jax(name, rng):
    """Under jit the result is opforge.jax's bit for bit; grad against the reference's, in float32."""
    arrays, attrs = reference(name).sample(rng, rows=4, cols=9)
    args = [jnp.asarray(a.astype(np.float32) if a.dtype == np.float64 else a) for a in arrays]
    np.testing.assert_array_equal(jax.jit(lambda *a: getattr(opforge, name)(*a, **attrs))(*args),
                                  jax.jit(lambda *a: getattr(oj, name)(*a, **attrs))(*args))
    floats = [i for i, a in enumerate(arrays) if a.dtype == np.float64]
    differentiable = [i for i in floats if tensor_names(name)[i] in CORE[name].backward[1]]

    def loss(fn):
        return lambda *a: jnp.sum(jnp.sin(fn(*a, **attrs)))
    got = jax.grad(loss(getattr(opforge, name)), argnums=differentiable)(*args)
    want = jax.grad(loss(reference(name).jax), argnums=differentiable)(*args)
    rtol, atol = TOLERANCES["float32"]
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol * 10, atol=atol * 10)


def test_vmap_takes_the_batch(rng):
    x = jnp.asarray(rng.standard_normal((3, 4, 16)).astype(np.float32))
    w = jnp.asarray(rng.standard_normal(16).astype(np.float32))
    got = jax.vmap(lambda x: opforge.rms_norm(x, w, eps=1e-6))(x)
    want = reference("rms_norm").jax(x, w, eps=1e-6)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_concrete_jax_arrays_run_one_compiled_call(name, rng):
    """JAX arrays alone go to opforge.jax, which runs one jitted call: the bits of jax.jit's,
    and the reference's values."""
    arrays, attrs = reference(name).sample(rng, rows=4, cols=9)
    args = [jnp.asarray(a.astype(np.float32) if a.dtype == np.float64 else a) for a in arrays]
    got = getattr(opforge, name)(*args, **attrs)
    assert isinstance(got, jax.Array)
    np.testing.assert_array_equal(got, jax.jit(lambda *a: getattr(oj, name)(*a, **attrs))(*args))
    want = reference(name).numpy(*arrays, **attrs)
    rtol, atol = TOLERANCES["float32"]
    np.testing.assert_allclose(np.asarray(got), want, rtol=rtol, atol=atol)


def test_concrete_jax_calls_raise_typed_errors():
    """Errors a kernel finds while running come back through XLA with a status code per kind,
    raised again as the type the other frontends raise; errors found while tracing are typed."""
    x = jnp.ones((4, 3), jnp.float32)
    for fn in (opforge.scatter_add, oj.scatter_add):
        with pytest.raises(ValueError) as error:
            fn(x, jnp.array([0, 1, 7, 9]), 5)
        assert str(error.value) == ("scatter_add(): 'index' must hold values in [0, dim_size) = [0, 5), "
                                    "got 7 at position 2")
    with pytest.raises(ValueError, match=r"^rms_norm\(\): 'weight' must have shape \[3\], got \[2\]"):
        opforge.rms_norm(x, jnp.ones(2, jnp.float32))
    with pytest.raises(TypeError, match=r"^add\(\): 'y' must be an array, got float"):
        oj.add(x, 1.0)  # bound before the compiled call, as under jit
    with pytest.raises(TypeError, match=r"add_one\(\): 'x' must have dtype in \[.*\], got complex64"):
        opforge.add_one(x.astype(jnp.complex64))


def test_concrete_jax_attributes_may_be_arrays(rng):
    """jit needs hashable attributes: a JAX scalar given as one is read as the number it holds."""
    x = jnp.asarray(rng.standard_normal((2, 8)).astype(np.float32))
    w = jnp.ones(8, jnp.float32)
    np.testing.assert_array_equal(opforge.rms_norm(x, w, eps=jnp.float32(1e-3)), opforge.rms_norm(x, w, eps=1e-3))


def test_concrete_jax_calls_skip_the_python_route(rng):
    """opforge.<op> and opforge.jax.<op> run a call on concrete JAX arrays from C++ (the jitted
    call opforge.jax makes, found by a key of the tensors given and the attribute values) without
    entering the Python function that binds calls; tracers still go through it."""
    calls = []
    for function in (opforge.relu, oj.relu):
        route = function._jax_route
        try:
            function._jax_route = lambda *a, **k: calls.append(a) or route(*a, **k)
            x = jnp.asarray(rng.standard_normal(7).astype(np.float32))
            np.testing.assert_array_equal(function(x), np.maximum(np.asarray(x), 0))
            assert calls == []
            jax.jit(function)(x)
            assert len(calls) == 1 and isinstance(calls[0][0], jax.core.Tracer)
        finally:
            function._jax_route = route
        calls.clear()


@pytest.mark.parametrize("function", ["opforge", "opforge.jax"])
def test_concrete_jax_calls_are_keyed_by_attributes_and_tensors_given(function, rng):
    """Each attribute value and each set of optional tensors given has its own compiled call:
    alternating them (and going past the 64 calls a function keeps) never reuses the wrong one."""
    module = opforge if function == "opforge" else oj
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w, b = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    jx, jw, jb = jnp.asarray(x), jnp.asarray(w), jnp.asarray(b)

    def layer_norm(eps, bias):
        centered = x.astype(np.float64) - x.mean(axis=-1, keepdims=True)
        y = centered / np.sqrt((centered**2).mean(axis=-1, keepdims=True) + eps) * w
        return y + b if bias else y

    for eps in [1e-5, 1.0, 1e-5, 4.0] + [float(k) for k in range(1, 70)] + [1.0]:
        for bias in (True, False):
            got = module.layer_norm(jx, jw, jb, eps=eps) if bias else module.layer_norm(jx, jw, eps=eps)
            np.testing.assert_allclose(np.asarray(got), layer_norm(eps, bias), rtol=1e-5, atol=1e-5)
    # Positional, keyword and default: the same key; a string attribute too.
    np.testing.assert_array_equal(module.layer_norm(jx, jw, None, 1e-5), module.layer_norm(jx, jw))
    relu = module.linear_act(jx, jnp.asarray(w[None, :]), act="relu")
    np.testing.assert_allclose(np.asarray(relu), np.maximum(x @ w[:, None], 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(module.linear_act(jx, jnp.asarray(w[None, :]))), x @ w[:, None],
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match=r"^layer_norm\(\): 'eps' must be a float, got str"):
        module.layer_norm(jx, jw, eps="small")
    with pytest.raises(ValueError, match=r"^linear_act\(\): 'act' must be one of"):
        module.linear_act(jx, jnp.asarray(w[None, :]), act="swish2")


def test_jax_only_function_errors_name_what_is_missing():
    """The C++ side of opforge.jax.<op> without its Python route, and its hooks given the wrong
    things: typed errors, not a crash."""
    bare = opforge._core.function(opforge._core.op("relu"), jax_only=True)
    with pytest.raises(RuntimeError, match=r"^relu\(\): opforge.jax has not set this function's route$"):
        bare(np.ones(2, np.float32))
    with pytest.raises(TypeError, match="^relu\\(\\) takes 1 arguments but 2 were given$"):
        bare(jnp.ones(2), jnp.ones(2))  # no route to word it: the binding's own error
    with pytest.raises(TypeError, match=r"^_set_jax_hooks: expected the tracer type and an exception class$"):
        opforge._core._set_jax_hooks(1, print, print, ValueError)
    np.testing.assert_array_equal(oj.relu(jnp.array([-1.0, 2.0])), [0.0, 2.0])  # hooks untouched


def test_functions_pickle_and_copy_by_name():
    """opforge.<op> and opforge.jax.<op> pickle and copy as Python's functions do: by reference to
    the module attribute, so a model or closure holding one survives copy.deepcopy, and another
    process (multiprocessing, a saved object) gets the same function."""
    import copy
    import pickle

    for function in (opforge.rms_norm, oj.rms_norm):
        assert copy.copy(function) is function and copy.deepcopy([function])[0] is function
        assert pickle.loads(pickle.dumps(function)) is function
    code = ("import pickle, sys, numpy as np, jax.numpy as jnp\n"
            "f, g = pickle.loads(sys.stdin.buffer.read())\n"
            "print(f.__module__, g.__module__, f(np.array([-1.0, 2.0])).tolist(), g(jnp.array([-3.0, 4.0])).tolist())")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps((opforge.relu, oj.relu)),
                         capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().split() == ["opforge", "opforge.jax", "[0.0,", "2.0]", "[0.0,", "4.0]"]
    # A function made apart from the package is no module attribute: pickle says so.
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(opforge._core.function(opforge._core.op("relu")))


def test_mixed_jax_and_numpy_take_the_generic_path(rng):
    x = jnp.asarray(rng.standard_normal((2, 8)).astype(np.float32))
    y = rng.standard_normal(8).astype(np.float32)
    got = opforge.add(x, y)
    assert isinstance(got, jax.Array)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(x) + y)


@pytest.mark.parametrize("order", ["jax first", "opforge first"])
def test_jax_route_exists_whichever_is_imported_first(order):
    # Libraries probe for JAX with find_spec before (or without) importing it: that must not
    # use up the hook that loads opforge.jax when JAX is imported.
    imports = ("import jax, opforge" if order == "jax first" else
               "import importlib.util, opforge, sys; assert 'jax' not in sys.modules\n"
               "assert importlib.util.find_spec('jax') is not None\nimport jax")
    code = (f"{imports}\nimport sys, jax.numpy as jnp\nassert 'opforge.jax' in sys.modules\n"
            "print(jax.jit(opforge.relu)(jnp.array([-1.0, 2.0])).tolist())")
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0.0, 2.0]"


def test_dynamo_loaded_later_compiles_without_warnings():
    code = ("import torch, opforge, sys\nassert 'torch._dynamo' not in sys.modules\n"
            "f = torch.compile(lambda x: opforge.relu(x) * 2, backend='aot_eager', fullgraph=True)\n"
            "print(f(torch.tensor([-1.0, 3.0])).tolist())")
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0.0, 6.0]"


def test_a_broken_adapter_is_a_warning_not_a_failed_import():
    """An adapter that fails as its framework loads (here JAX refusing the FFI handler) costs a
    warning: opforge imports, NumPy calls work, and JAX arrays take the generic path."""
    code = ("import jax, jax.ffi, numpy as np\n"
            "def refuse(*args, **kwargs):\n    raise RuntimeError('no FFI here')\n"
            "jax.ffi.register_ffi_target = refuse\n"
            "import opforge, sys\nassert 'opforge.jax' not in sys.modules\n"
            "print(opforge.relu(np.array([-1.0, 2.0])).tolist(), opforge.relu(jax.numpy.array([-3.0])).tolist())")
    out = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0.0, 2.0] [0.0]"
    assert "opforge: opforge.jax (and opforge.<op> under jax.jit) is unavailable: no FFI here" in out.stderr
