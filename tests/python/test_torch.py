"""opforge.torch: every registered op as a real torch operator, held to one bar without naming
ops: opcheck, gradcheck, torch.compile, references on strided inputs, errors, the stable ABI.

Inputs come from each op's reference (opforge.references.<name>.sample); a backward op without
one is fed from its forward op's sample (the cotangent drawn like the forward result).
"""

import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch._dynamo  # noqa: E402
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import opforge.torch as ot  # noqa: E402
from opforge.testing import FLOAT_DTYPES, STRIDED_KINDS, TOLERANCES, strided, torch_ops_dispatched  # noqa: E402
from op_samples import (CORE, OPS, WITH_REFERENCE, check_grads_against_reference, dtypes, reference,  # noqa: E402
                        sample, significant, torch_strides)

DIFFERENTIABLE = [n for n in OPS if CORE[n].backward]
ON_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=ON_CUDA)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, dtype", [pytest.param(n, d, id=f"{n}-{d}") for n in OPS for d in dtypes(n)])
def test_opcheck(name, dtype, device, rng):
    """All of opcheck's checks. Autograd registration needs inputs that require grad: a float
    dtype (every op has an autograd kernel; ops without a backward raise when differentiated)."""
    op = getattr(torch.ops.opforge, name).default
    differentiable = bool(CORE[name].backward) and dtype in FLOAT_DTYPES
    tensors, attrs = sample(name, rng, dtype, grad=differentiable, device=device)
    checks = ["test_schema", "test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic"]
    torch.library.opcheck(op, tuple(tensors), attrs, test_utils=checks + ["test_autograd_registration"] * differentiable)
    if dtype in FLOAT_DTYPES and not differentiable:
        needing = [t.detach().requires_grad_(t.is_floating_point()) for t in tensors]
        torch.library.opcheck(op, tuple(needing), attrs, test_utils="test_autograd_registration")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_gradcheck_float64(name, device, rng):
    tensors, attrs = sample(name, rng, "float64", rows=3, cols=7, grad=True, device=device)
    assert torch.autograd.gradcheck(lambda *t: getattr(torch.ops.opforge, name)(*t, **attrs), tuple(tensors))


@pytest.mark.parametrize("name", [n for n in DIFFERENTIABLE if n in WITH_REFERENCE])
def test_grad_matches_reference_grad(name, rng):
    check_grads_against_reference(getattr(ot, name), name, rng)


def test_op_without_backward_raises_when_differentiated(rng):
    name = next(n for n in OPS if not CORE[n].backward)
    tensors, attrs = sample(name, rng, "float64", grad=False)
    tensors[0].requires_grad_()
    out = getattr(ot, name)(*tensors, **attrs)
    out = out[0] if isinstance(out, tuple) else out
    with pytest.raises(RuntimeError, match=rf"{name}\(\) is not differentiable"):
        out.sum().backward()


@pytest.fixture
def fresh_dynamo():
    """Each parametrized case compiles the same code objects anew; without a reset they would
    count against dynamo's recompile limit."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_compile_fullgraph_matches_eager(name, device, rng, fresh_dynamo):
    tensors, attrs = sample(name, rng, "float32", device=device)

    def f(*t):
        out = getattr(ot, name)(*[u * 1 for u in t], **attrs)
        return (out if isinstance(out, torch.Tensor) else out[0]) * 2

    # fullgraph=True turns any graph break into an error.
    torch.testing.assert_close(torch.compile(f, fullgraph=True, backend="aot_eager")(*tensors), f(*tensors))


@pytest.mark.parametrize("name", [n for n in DIFFERENTIABLE if n in WITH_REFERENCE])
def test_compile_dynamic_shapes_and_backward(name, rng, fresh_dynamo):
    """Once a changing size is made dynamic (at the first recompile), new sizes reuse the graph:
    results are sized by the inputs' SymInts, forward and backward."""
    op = getattr(torch.ops.opforge, name)
    attrs = sample(name, rng, "float64")[1]
    counter = CompileCounterWithBackend("aot_eager")
    fn = torch.compile(lambda *t: op(*t, **attrs).square().sum(), fullgraph=True, backend=counter)
    compiled = []
    for rows in (3, 6, 9, 12):
        tensors = sample(name, rng, "float64", rows=rows, cols=8, grad=True)[0]
        copies = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
        fn(*tensors).backward()
        op(*copies, **attrs).square().sum().backward()
        for t, c in zip(tensors, copies):
            if t.grad is not None:
                torch.testing.assert_close(t.grad, c.grad)
        compiled.append(counter.frame_count)
    assert compiled[1] == compiled[-1], compiled


def test_compile_with_inductor(rng, fresh_dynamo):
    (x, w), attrs = sample("rms_norm", rng, "float32")
    f = lambda x, w: ot.rms_norm(x.relu(), w, **attrs) + 1  # noqa: E731
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x, w), f(x, w))


@ON_CUDA
def test_compile_reduce_overhead_on_cuda(fresh_dynamo):
    """Inductor's CUDA graphs (mode="reduce-overhead") record opforge's ops beside torch's and replay
    them, forward and backward: linear_act then rms_norm, called until recorded and replayed, on
    fresh inputs each time, with the gradients of both weights, matching eager."""
    reduce_overhead_matches_eager("cuda")


def reduce_overhead_matches_eager(device):
    w1 = torch.randn(96, 64, device=device, requires_grad=True)
    g = torch.rand(96, device=device, requires_grad=True)

    def forward(x):
        return ot.rms_norm(ot.linear_act(x, w1, None, act="gelu"), g, 1e-6)

    compiled = torch.compile(forward, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):  # warm-up, recording, then replays
        x = torch.randn(32, 64, device=device)
        got, want = compiled(x), forward(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        grads = torch.autograd.grad(got.square().sum(), (w1, g))
        for a, b in zip(grads, torch.autograd.grad(want.square().sum(), (w1, g))):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3)


def float64_reference(name, values, attrs):
    return reference(name).torch(*[torch.from_numpy(v) for v in values], **attrs).numpy()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", STRIDED_KINDS["torch"])
@pytest.mark.parametrize("name", WITH_REFERENCE)
def test_strided_inputs_match_reference(name, kind, dtype, rng):
    if dtype not in dtypes(name):
        pytest.skip(f"{name} does not take {dtype}")
    tensors, attrs = sample(name, rng, dtype, rows=6, cols=17)
    if not any(t.is_floating_point() for t in tensors):
        pytest.skip(f"{name} has no float input to stride")
    views, values = zip(*[strided(rng, tuple(t.shape), "torch", dtype, kind) if t.is_floating_point()
                          else (t, t.numpy()) for t in tensors])
    assert not all(v.is_contiguous() for v in views)
    want = float64_reference(name, values, attrs)
    for fn in (getattr(ot, name), getattr(torch.ops.opforge, name)):
        got = fn(*views, **attrs)
        if not np.issubdtype(want.dtype, np.floating):  # bytes (ggml blocks): exact
            assert got.is_contiguous() and got.numpy().dtype == want.dtype
            np.testing.assert_array_equal(got.numpy(), want)
            continue
        # Row-major, or an elementwise op's inputs' layout (tests/python/test_layout.py)
        assert got.is_contiguous() if not CORE[name].elementwise else significant(got) == torch_strides(name, views)
        assert got.dtype == getattr(torch, dtype)
        rtol, atol = TOLERANCES[dtype]
        np.testing.assert_allclose(got.double().numpy(), want, rtol=rtol, atol=atol)


# Bad inputs: eager calls raise opforge's type and message; compiled ones fail while tracing,
# as torch's own ops do (TorchRuntimeError) with opforge's error inside.
BAD = [
    (lambda: ot.rms_norm(torch.ones(2, 4), torch.ones(3)), ValueError,
     "rms_norm(): 'weight' must have shape [4], got [3]"),
    (lambda: ot.rms_norm(torch.ones(2, 4, dtype=torch.int32), torch.ones(4, dtype=torch.int32)), TypeError,
     "rms_norm(): 'x' must have dtype in [float32, float64, float16, bfloat16], got int32"),
    (lambda: ot.add(torch.ones(3), torch.ones(3, dtype=torch.float64)), TypeError,
     "add(): 'y' must have dtype float32 like 'x', got float64"),
    (lambda: ot.add(torch.ones(2, 3), torch.ones(4)), ValueError,
     "add(): 'x' of shape [2, 3] and 'y' of shape [4] cannot be broadcast together"),
    (lambda: ot.rms_norm(torch.ones(2, 4), torch.ones(4), eps=-1.0), ValueError, "rms_norm(): 'eps' must be >= 0"),
    (lambda: ot.add_one(torch.ones(3, dtype=torch.complex64)), TypeError,
     "add_one(): 'x' must have dtype in [float32, float64, float16, bfloat16, int32, int64], got complex64"),
]


@pytest.mark.parametrize("call, error, message", BAD)
@pytest.mark.parametrize("path", ["opforge.torch", "torch.ops", "compile"])
def test_bad_input(call, error, message, path, monkeypatch):
    if path == "torch.ops":  # the same calls, straight through the dispatcher
        monkeypatch.setattr(ot, "add", torch.ops.opforge.add)
        monkeypatch.setattr(ot, "add_one", torch.ops.opforge.add_one)
        monkeypatch.setattr(ot, "rms_norm", torch.ops.opforge.rms_norm)
    if path == "compile":
        torch._dynamo.reset()  # the lambdas share code objects: count no recompiles against the limit
        with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=re.escape(message)) as info:
            torch.compile(call, fullgraph=True, backend="aot_eager")()
        assert f"{error.__name__}(" in str(info.value)
    else:
        with pytest.raises(error, match=re.escape(message)):
            call()


def test_inference_mode_skips_python_and_raises_runtime_error():
    with torch.inference_mode(), pytest.raises(RuntimeError, match=re.escape("'weight' must have shape [4], got [3]")):
        torch.ops.opforge.rms_norm(torch.ones(2, 4), torch.ones(3))
    with torch.inference_mode(), pytest.raises(ValueError, match=re.escape("'weight' must have shape [4], got [3]")):
        ot.rms_norm(torch.ones(2, 4), torch.ones(3))


@pytest.mark.parametrize("call, message", [
    (lambda: ot.add(torch.ones(3), 1.0), "add(): 'y' must be a Tensor, got float"),
    (lambda: ot.rms_norm(torch.ones(2, 4), torch.ones(4), eps="a"), "rms_norm(): 'eps' must be a float, got str"),
    (lambda: ot.rms_norm(torch.ones(2, 4)), "rms_norm() missing 1 required positional argument: 'weight'"),
    (lambda: ot.rms_norm(torch.ones(2, 4), torch.ones(4), eps=np.ones(4)),
     "rms_norm(): 'eps' must be a float, got ndarray"),
    (lambda: ot.scatter_add(torch.ones(2, 3), torch.zeros(2, dtype=torch.int64), 2.0),
     "scatter_add(): 'dim_size' must be an int, got float"),
])
def test_bad_argument_kinds(call, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        call()


@pytest.mark.parametrize("wants_grad", [False, True], ids=["plain", "requires_grad"])
@pytest.mark.parametrize("call, message", [
    (lambda t: ot.rms_norm(t(2, 4), torch.ones(4), eps=10**400), "rms_norm(): 'eps' is out of the float range"),
    (lambda t: ot.scatter_add(t(2, 3), torch.zeros(2, dtype=torch.int64), 2**70),
     "scatter_add(): 'dim_size' must fit in 64 bits"),
    (lambda t: ot.gelu(t(3), "\udcff"), "gelu(): 'approximate' is not valid Unicode text (it has a lone surrogate)"),
])
def test_attributes_out_of_range(call, message, wants_grad):
    """The same ValueError whether the call goes straight to opforge or, for tensors that need a
    gradient, through the torch op (whose own argument parser would raise RuntimeError)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        call(lambda *shape: torch.ones(*shape, requires_grad=wants_grad))


@pytest.mark.parametrize("call, error, message", [
    (lambda: ot.relu(torch.ones(1).expand(2**31, 2**31)), ValueError,
     "relu(): the result would have shape [2147483648, 2147483648] (float32), 2^63 bytes or more"),
    (lambda: torch.ops.opforge.relu(torch.ones(1).expand(2**31, 2**31)), ValueError,
     "relu(): the result would have shape [2147483648, 2147483648]"),
    (lambda: ot.relu(torch.ones(1).expand(2**46)), RuntimeError, "relu(): cannot allocate its results: "),
    (lambda: torch.ops.opforge.relu(torch.ones(1).expand(2**46)), RuntimeError,
     "relu(): cannot allocate its results: "),
    # a meta tensor beside a CPU one reaches the meta kernel, which must not make CPU results
    (lambda: ot.add(torch.ones(4, 8), torch.ones(4, 8, device="meta")), RuntimeError,
     "add(): 'y' is on meta but 'x' is on cpu; all tensors must be on one device"),
    (lambda: torch.ops.opforge.rms_norm(torch.ones(4, 8), torch.ones(8, device="meta"), 1e-6), RuntimeError,
     "rms_norm(): 'weight' is on meta but 'x' is on cpu; all tensors must be on one device"),
])
def test_values_no_kernel_can_take(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call()


def test_meta_tensors_alone_are_shape_inference():
    out = ot.add(torch.ones(4, 8, device="meta"), torch.ones(8, device="meta"))
    assert out.device.type == "meta" and out.shape == (4, 8)


def test_numpy_bool_attribute(rng):
    x, table = torch.randn(2, 3, 2, 4), torch.rand(3, 2)
    want = ot.rope(x, table, table, True)
    torch.testing.assert_close(ot.rope(x, table, table, np.bool_(True)), want, rtol=0, atol=0)
    torch.testing.assert_close(ot.rope(x, table, table, interleaved=np.bool_(True)), want, rtol=0, atol=0)


def test_numpy_scalars_as_attributes(rng):
    """What torch.ops.opforge takes, opforge.torch takes: NumPy scalars for floats and ints."""
    x, w = torch.randn(3, 4, dtype=torch.float64), torch.rand(4, dtype=torch.float64)
    torch.testing.assert_close(ot.rms_norm(x, w, np.float32(1e-3)), ot.rms_norm(x, w, float(np.float32(1e-3))))
    index = torch.tensor([0, 2, 0])
    torch.testing.assert_close(ot.scatter_add(x, index, np.int64(3)), ot.scatter_add(x, index, 3))


def test_device_mismatch_fails_while_tracing():
    with FakeTensorMode(), pytest.raises(RuntimeError, match=re.escape(
            "add(): 'y' is on cuda:0 but 'x' is on cpu; all tensors must be on one device")):
        torch.ops.opforge.add(torch.ones(3), torch.ones(3, device="cuda"))


@ON_CUDA
def test_cuda_on_current_stream_and_device_mismatch(rng):
    x = torch.randn(64, 4096, device="cuda")
    w = torch.randn(4096, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # x and w were made on the default stream
    with torch.cuda.stream(stream):
        got = ot.rms_norm(x, w)
    stream.synchronize()
    torch.testing.assert_close(got, reference("rms_norm").torch(x, w), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="all tensors must be on one device"):
        ot.add(x, w.cpu())


def test_fake_results_are_laid_out_like_real_ones(rng):
    """Row-major for a row op (softmax) on a transposed input, the input's layout for an
    elementwise one (add_one): FakeTensorMode, outside opcheck."""
    x = torch.randn(8, 6).t()  # non-contiguous input
    for op, want in ((torch.ops.opforge.softmax, (8, 1)), (torch.ops.opforge.add_one, (1, 6))):
        with FakeTensorMode() as mode:
            fake = op(mode.from_tensor(x))
        real = op(x)
        assert fake.shape == real.shape and fake.stride() == real.stride() == want


def test_adapter_imports_no_unstable_torch_symbols():
    """The stable-ABI promise: the library imports C functions (aoti_torch_*, torch_*) only,
    and does not link libc10 or libtorch_python."""
    nm, readelf = shutil.which("nm"), shutil.which("readelf")
    if not nm or not readelf:
        pytest.skip("needs binutils (nm, readelf)")
    library = str(ot._LIBRARY)
    undefined = subprocess.run([nm, "-D", "--undefined-only", library], capture_output=True, text=True, check=True)
    symbols = [line.split()[-1] for line in undefined.stdout.splitlines()]
    # Anything in namespace c10, at or torch, mangled: _ZN3c10..., _ZNK2at..., _ZTIN5torch...
    unstable = [s for s in symbols if re.match(r"_Z(T[IVS])?N[KVr]*(3c10|2at|5torch)\d", s)]
    assert not unstable, f"unstable LibTorch C++ symbols imported: {unstable}"
    assert any(s.startswith("aoti_torch_") for s in symbols)
    needed = subprocess.run([readelf, "-d", library], capture_output=True, text=True, check=True).stdout
    assert "libtorch_cpu.so" in needed
    assert "libc10.so" not in needed and "libtorch_python.so" not in needed


def test_stub_matches_registry():
    stub = Path(__file__).parents[2] / "python" / "opforge" / "torch.pyi"
    assert stub.read_text() == ot._stub_text(), "regenerate: python -m opforge.torch --write-stub"


@pytest.mark.parametrize("name", OPS)
def test_functions_and_ops_follow_the_schema(name):
    fn = getattr(ot, name)
    *params, out = inspect.signature(fn).parameters.values()  # the last: out= (the out variant's)
    assert (out.name, out.kind, out.default) == ("out", inspect.Parameter.KEYWORD_ONLY, None)
    assert [p.name for p in params] == [a["name"] for a in CORE[name].args]
    assert [p.annotation for p in params] == [ot._KINDS[a["kind"]][0] for a in CORE[name].args]
    assert CORE[name].schema in fn.__doc__ and CORE[name].doc in fn.__doc__
    schema = getattr(torch.ops.opforge, name).default._schema
    assert [a.name for a in schema.arguments] == [a["name"] for a in CORE[name].args]
    assert len(schema.returns) == CORE[name].num_results


def test_import_opforge_defines_torch_ops_without_importing_torch():
    code = ("import sys, opforge; assert 'torch' not in sys.modules; import torch; "
            "print(torch.ops.opforge.add_one(torch.ones(2)).tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0 and out.stdout.strip() == "[2.0, 2.0]", out.stderr


def test_autograd_runs_in_cpp_on_the_torch_it_was_built_for():
    """CI builds the torch-specific library against the torch it tests with, so the C++
    autograd kernels must be the ones in use (the Python rules are the fallback elsewhere)."""
    assert ot.NATIVE_AUTOGRAD, "libopforge_torch_native.so was not built or its version file does not match"
    x = torch.randn(3, 4, requires_grad=True)
    assert torch.ops.opforge.rms_norm(x, torch.ones(4)).grad_fn.name() == "opforge::rms_normBackward"
    with torch.no_grad():
        assert torch.ops.opforge.rms_norm(x, torch.ones(4)).grad_fn is None


def test_cpp_autograd_edges_follow_the_declaration():
    """Arguments declared not differentiable (rope's tables) get no gradient even when they
    require one; an absent optional argument (layer_norm's bias) gets None; double backward
    through an op whose backward declares no backward is an error, not a wrong answer."""
    x = torch.randn(2, 3, 2, 4, dtype=torch.float64, requires_grad=True)
    cos, sin = (torch.randn(3, 2, dtype=torch.float64, requires_grad=True) for _ in range(2))
    torch.ops.opforge.rope(x, cos, sin, False).sum().backward()
    assert x.grad is not None and cos.grad is None and sin.grad is None
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    out = torch.ops.opforge.layer_norm(v, w, None, 1e-5)
    (gv,) = torch.autograd.grad(out.square().sum(), v, create_graph=True)
    with pytest.raises(RuntimeError, match="layer_norm_backward\\(\\) is not differentiable"):
        gv.sum().backward()


def test_second_derivatives_raise_instead_of_dropping_terms():
    """A backward op has no backward op: its node must still be on the graph (edges to its
    inputs), so a second derivative raises rather than treating the first as a constant."""
    x = torch.tensor([0.5, -1.0], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(ot.gelu(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=re.escape("gelu_backward() is not differentiable")):
        torch.autograd.grad(g.sum() + x.sum(), x)
    with pytest.raises(RuntimeError, match="is not differentiable"):
        torch.autograd.gradgradcheck(lambda v: ot.rms_norm(v, torch.ones(2, dtype=torch.float64)), (x[None],))


@pytest.mark.parametrize("transform", ["jvp", "jacfwd", "hessian", "dual"])
def test_forward_mode_ad_is_refused(transform):
    """Forward-mode AD would drop the tangents below the op (zeros, silently): an error instead."""
    x, t = torch.tensor([0.5, -1.0], dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    run = {
        "jvp": lambda: torch.func.jvp(ot.gelu, (x,), (t,)),
        "jacfwd": lambda: torch.func.jacfwd(ot.add_one)(x),
        "hessian": lambda: torch.func.hessian(lambda v: ot.gelu(v).sum())(x),
        "dual": lambda: dual_gelu(x, t),
    }[transform]
    refused = r"\(\): forward-mode AD \(jvp, jacfwd, dual tensors\) is not supported"
    with pytest.raises(NotImplementedError, match=refused):
        run()


def dual_gelu(x, t):
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        return ot.gelu(fwAD.make_dual(x, t))


def test_python_autograd_fallback_in_a_subprocess():
    """OPFORGE_TORCH_NATIVE=0: the rules registered in Python (what a torch other than the
    build's gets) give the same gradients (also through an op with a saving forward) and typed
    errors."""
    code = """
import torch, opforge.torch as ot
assert not ot.NATIVE_AUTOGRAD
x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
w = torch.randn(5, dtype=torch.float64, requires_grad=True)
assert torch.autograd.gradcheck(lambda a, b: torch.ops.opforge.rms_norm(a, b, 1e-6), (x, w))
# linear_act's saving forward cannot run here: its backward op gets preact=None and recomputes.
wl = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
b = torch.randn(4, dtype=torch.float64, requires_grad=True)
assert torch.autograd.gradcheck(lambda a, m, c: ot.linear_act(a, m, c, act="gelu"), (x, wl, b))
try:
    torch.ops.opforge.add(torch.ones(3), torch.ones(4))
except ValueError as e:
    assert "cannot be broadcast" in str(e)
else:
    raise AssertionError("no error")
print("ok")
"""
    env = {**os.environ, "OPFORGE_TORCH_NATIVE": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_direct_call_hands_what_it_cannot_run_to_the_torch_op():
    """opforge.torch.<op> runs plain CPU tensors itself (those needing a gradient through the
    dispatcher, boxed); FakeTensors, dispatch modes and functorch transforms go through
    torch.ops.opforge (same results)."""
    x, w = torch.randn(4, 6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    want = torch.ops.opforge.rms_norm(x, w, 1e-6)
    torch.testing.assert_close(ot.rms_norm(x, w), want, rtol=0, atol=0)
    xg = x.clone().requires_grad_()
    assert ot.rms_norm(xg, w).grad_fn is not None
    with torch.no_grad():
        assert ot.rms_norm(xg, w).grad_fn is None
    with FakeTensorMode() as mode:
        fake = ot.rms_norm(mode.from_tensor(x), mode.from_tensor(w))
        assert fake.shape == (4, 6) and type(fake).__name__ == "FakeTensor"

    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):  # an active dispatch mode must see the op
        seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Recorder():
        ot.rms_norm(x, w)
    assert "opforge.rms_norm.default" in Recorder.seen
    grad = torch.func.grad(lambda v: ot.rms_norm(v, w).sum())(x)  # functorch: through the op's autograd
    torch.testing.assert_close(grad, torch.autograd.grad(ot.rms_norm(xg, w).sum(), xg)[0])


def direct_backward_calls() -> int:
    import ctypes

    count = ot._native_library.opforge_torch_native_direct_backward_calls
    count.restype = ctypes.c_uint64
    return count()


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_backward_ops_run_directly_with_the_dispatchers_bits(name, dtype, rng):
    """An autograd node runs its backward op straight on opforge's kernel when every tensor is a
    plain CPU one (bindings/torch_native/cpu_direct.h), and through torch's dispatcher when
    something must see the call (here a dispatch mode, which lists what it saw): the same
    gradients, bit for bit, and the direct path taken exactly where the backward op runs."""
    tensors, attrs = sample(name, rng, dtype, grad=True)
    wanted = [t for t in tensors if t.requires_grad]
    result = getattr(ot, name)(*tensors, **attrs)
    g = torch.from_numpy(rng.standard_normal(tuple(result.shape))).to(result.dtype)

    def grads():
        return torch.autograd.grad(getattr(ot, name)(*tensors, **attrs), wanted, g, allow_unused=True)

    before = direct_backward_calls()
    direct = grads()
    ran_directly = direct_backward_calls() - before
    dispatched = []
    seen = torch_ops_dispatched(lambda: dispatched.extend(grads()))
    assert direct_backward_calls() - before == ran_directly, "the dispatch mode's call went around the dispatcher"
    assert ran_directly == seen.count(CORE[name].backward[0]), seen
    for a, b in zip(direct, dispatched):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def test_direct_backward_ops_appear_in_torchs_profiler():
    """The direct paths (forward and backward) are listed under the op's name, as the dispatcher's
    calls are."""
    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(16)
    before = direct_backward_calls()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        ot.rms_norm(x, w).sum().backward()
        ot.relu(x.detach())
    names = {e.key for e in prof.key_averages()}
    assert direct_backward_calls() - before == 1
    assert {"opforge::rms_norm_backward", "opforge::relu"} <= names, sorted(names)


def test_direct_backward_op_errors_keep_their_type():
    """An opforge error from a backward op run directly reaches Python with its type: rms_norm's
    weight swapped for one of another dtype after the forward."""
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4)
    out = ot.rms_norm(x, w)
    w.data = torch.randn(4, dtype=torch.float64)  # the saved weight now disagrees with x
    message = r"rms_norm_backward\(\): 'weight' must have dtype float32 like 'grad', got float64"
    with pytest.raises(TypeError, match=message):
        out.sum().backward()


@pytest.mark.parametrize("wants_grad", [False, True])
def test_jit_trace_records_the_op(wants_grad):
    """torch.jit.trace sees opforge.torch's calls and torch.ops.opforge's (the direct paths once
    ran them past the tracer, which then recorded only the result's allocation)."""
    x = torch.randn(3, 4).requires_grad_(wants_grad)
    for call in (ot.relu, torch.ops.opforge.relu):
        traced = torch.jit.trace(lambda a: call(a) + 1, (x,))
        assert "opforge::relu" in str(traced.graph), traced.graph
        y = torch.randn(3, 4)
        torch.testing.assert_close(traced(y), torch.relu(y) + 1, rtol=0, atol=0)


@pytest.mark.parametrize("wants_grad", [False, True])
def test_direct_call_respects_torch_function(wants_grad):
    """A torch function mode sees opforge.torch's calls, and a tensor subclass keeps its type, as
    with torch's own ops (the direct call once skipped both); nn.Parameter, whose
    __torch_function__ is disabled, gives a plain tensor as torch.relu does."""
    from torch.overrides import TorchFunctionMode

    class Recorder(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    class Tagged(torch.Tensor):
        pass

    x = torch.randn(4, 6, dtype=torch.float64).requires_grad_(wants_grad)
    w = torch.randn(6, dtype=torch.float64)
    with Recorder() as recorder:
        ot.rms_norm(x, w)
    assert recorder.seen == ["opforge.rms_norm.default"]
    tagged = x.detach().as_subclass(Tagged).requires_grad_(wants_grad)
    assert type(ot.rms_norm(tagged, w)) is type(torch.relu(tagged)) is Tagged
    param = torch.nn.Parameter(x.detach().clone())
    assert type(ot.relu(param)) is type(torch.relu(param)) is torch.Tensor
    out = ot.rms_norm(param, w)
    assert out.requires_grad and out.grad_fn is not None
    torch.testing.assert_close(out, torch.ops.opforge.rms_norm(x.detach(), w, 1e-6), rtol=0, atol=0)


def test_large_cpu_results_reuse_backend_memory():
    """Results of 1 MiB and more come from opforge's CPU block cache, which keeps freed blocks
    mapped, through both entry points; torch frees them back into it."""
    x = torch.randn(1024, 1024)
    for call in (ot.add_one, torch.ops.opforge.add_one):
        first = call(x)
        address = first.data_ptr()
        torch.testing.assert_close(first, x + 1)
        del first
        again = call(x)
        assert again.data_ptr() == address
        torch.testing.assert_close(again, x + 1)
