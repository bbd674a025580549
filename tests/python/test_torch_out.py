"""torch.ops.opforge.<op>.out, every op's out variant (opforge/out.h, bindings/torch): opcheck,
torch.compile(fullgraph=True) over opforge.torch.<op>(..., out=) and opforge.<op>(..., out=),
autograd's view of the write, and its errors. Results are compared with the op's allocating
variant on the same inputs (test_out.py holds the bit-for-bit comparisons of every op)."""

import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import torch._dynamo  # noqa: E402

import opforge  # noqa: E402
import opforge.torch as ot  # noqa: E402
from opforge.testing import FLOAT_DTYPES  # noqa: E402
from op_samples import CORE, OPS, dtypes, sample  # noqa: E402

ON_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=ON_CUDA)]


def one_dtype(name):
    found = dtypes(name)
    return "float32" if "float32" in found else found[0]


def as_tuple(result):
    return result if isinstance(result, tuple) else (result,)


def poisoned_like(t):
    return torch.full_like(t, float("nan")) if t.is_floating_point() else torch.full_like(t, 77)


def out_names(name):
    packet = getattr(torch.ops.opforge, name)
    return [a.name for a in packet.out._schema.arguments[len(CORE[name].args):]]


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_every_op_has_an_out_variant_returning_nothing():
    """Returning nothing (not the outs, aliased) is what lets torch.compile functionalize it."""
    for name in OPS:
        schema = getattr(torch.ops.opforge, name).out._schema
        assert str(schema).endswith("-> ()"), schema
        n = CORE[name].num_results
        assert out_names(name) == (["out"] if n == 1 else [f"out{i}" for i in range(n)])
        assert all(a.kwarg_only and a.alias_info.is_write for a in schema.arguments[len(CORE[name].args):])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_opcheck(name, device, rng):
    """All of opcheck's checks on the out variant: its schema (it writes the outs and nothing
    else), the fake kernel against the real one, AOT dispatch (functionalized), and that tensors
    needing a gradient meet an autograd kernel (which refuses them)."""
    dtype = one_dtype(name)
    tensors, attrs = sample(name, rng, dtype, device=device)
    outs = [poisoned_like(w) for w in as_tuple(getattr(torch.ops.opforge, name)(*tensors, **attrs))]
    kwargs = {**attrs, **dict(zip(out_names(name), outs))}
    checks = ["test_schema", "test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic"]
    torch.library.opcheck(getattr(torch.ops.opforge, name).out, tuple(tensors), kwargs, test_utils=checks)
    if dtype in FLOAT_DTYPES:
        needing = [t.detach().requires_grad_(t.is_floating_point()) for t in tensors]
        with pytest.raises(TypeError, match="requires grad, and out= does not support autograd"):
            getattr(torch.ops.opforge, name).out(*needing, **kwargs)


@pytest.mark.parametrize("name", OPS)
def test_compile_fullgraph_writes_outs(name, rng, fresh_dynamo):
    """Under torch.compile(fullgraph=True) the out variant is functionalized and the write lands
    in the caller's tensors, as in eager; the compiled function also reads them after the write."""
    tensors, attrs = sample(name, rng, one_dtype(name))
    want = as_tuple(getattr(ot, name)(*tensors, **attrs))
    single = len(want) == 1

    def f(*args):
        *inputs, out = args
        got = getattr(ot, name)(*inputs, **attrs, out=out[0] if single else tuple(out))
        return [o.clone() for o in as_tuple(got)]

    outs = [poisoned_like(w) for w in want]
    copies = torch.compile(f, fullgraph=True, backend="aot_eager")(*tensors, outs)
    for o, c, w in zip(outs, copies, want):
        assert torch.equal(o, w) and torch.equal(c, w)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_in_place_graph_outs_and_partial_tuples(backend, rng, fresh_dynamo):
    x = torch.randn(6, 10, dtype=torch.float64)
    y = torch.randn(10, dtype=torch.float64)
    g = torch.randn(6, 10, dtype=torch.float64)

    def f(x, y, g, out):
        opforge.add(x, y, out=out)              # the generic function: traced into the same op
        ot.relu(x, out=x)                       # in place over the graph's input
        inner = torch.empty_like(g)
        ot.silu(out, out=inner)                 # an out made inside the graph
        grads = ot.add_backward(g, x, y, out=(None, torch.empty(10, dtype=torch.float64)))
        return inner + 1, grads

    xc, out = x.clone(), torch.empty(6, 10, dtype=torch.float64)
    inner, grads = torch.compile(f, fullgraph=True, backend=backend)(xc, y, g, out)
    assert torch.equal(out, x + y)
    assert torch.equal(xc, torch.relu(x))
    torch.testing.assert_close(inner, torch.nn.functional.silu(x + y) + 1)
    want = ot.add_backward(g, torch.relu(x), y)
    assert torch.equal(grads[0], want[0]) and torch.allclose(grads[1], want[1])


def test_compile_reports_a_wrong_out_with_opforges_message(fresh_dynamo):
    def f(x, y, out):
        ot.add(x, y, out=out)

    with pytest.raises(Exception, match=re.escape("add(): 'out' must have shape [4, 5], got [3, 5]")):
        torch.compile(f, fullgraph=True, backend="aot_eager")(torch.randn(4, 5), torch.randn(5), torch.empty(3, 5))


def test_out_variant_marks_outs_written_and_refuses_grad():
    """Called directly, the out variant bumps each out's version counter (so autograd refuses a
    value it saved before the write) and refuses tensors that need a gradient, as torch's own
    out= variants do; under no_grad they are fine."""
    w = torch.randn(5, requires_grad=True)
    saved = torch.randn(5)
    loss = (w * saved).sum()
    version = saved._version
    assert torch.ops.opforge.add.out(torch.ones(5), torch.ones(5), out=saved) is None
    assert saved._version == version + 1 and torch.equal(saved, torch.full((5,), 2.0))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    x = torch.randn(5, requires_grad=True)
    for args, kwargs, named in [((x, x), {"out": torch.empty(5)}, "x"),
                                ((x.detach(), x.detach()), {"out": torch.empty(5, requires_grad=True)}, "out")]:
        with pytest.raises(TypeError, match=re.escape(f"add(): '{named}' is a torch tensor that requires grad, and "
                                                      "out= does not support autograd")):
            torch.ops.opforge.add.out(*args, **kwargs)
    with torch.no_grad():
        out = torch.empty(5)
        torch.ops.opforge.add.out(x, x, out=out)
    assert torch.equal(out, 2 * x.detach())


def test_out_arguments_are_typed_errors():
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match=re.escape("add_backward(): 'out' must be a tuple of 2 arrays (one per result), "
                                                  "got Tensor")):
        ot.add_backward(x, x, x, out=torch.empty(3, 4))
    with pytest.raises(TypeError, match=re.escape("add(): 'out' must hold 1 array (one per result), got a list of 2")):
        ot.add(x, x, out=[torch.empty(3, 4), torch.empty(3, 4)])
    with pytest.raises(TypeError, match=re.escape("add(): 'out[0]' must be a torch tensor, got ndarray")):
        ot.add(x, x, out=(x.numpy(),))
    with pytest.raises(TypeError, match=re.escape("add(): 'out' must be a torch tensor, got int")):
        ot.add(x, x, out=3)
    with pytest.raises(ValueError, match=re.escape("rms_norm(): 'out' shares memory with 'x'; out= may not overlap")):
        ot.rms_norm(x, torch.ones(4), out=x)
    with pytest.raises(ValueError, match=re.escape("add_backward(): 'out[1]' shares memory with 'out[0]'")):
        shared = torch.empty(3, 4)
        ot.add_backward(x, x, x, out=(shared, shared))
    with pytest.raises(ValueError, match=re.escape("add(): 'out' must be dense (every element once")):
        ot.add(x, x, out=torch.empty(3, 8)[:, ::2])


def test_without_the_native_library_the_python_kernels_do_the_same():
    """Where libopforge_torch_native.so is not loaded (another torch version; forced here), the
    out variant's Autograd kernel is Python's: the same refusal, version bump and results."""
    code = """
import torch, opforge.torch as ot
assert not ot.NATIVE_AUTOGRAD
x, out = torch.randn(5), torch.empty(5)
version = out._version
assert torch.ops.opforge.add.out(x, x, out=out) is None and torch.equal(out, 2 * x) and out._version == version + 1
assert ot.relu(x, out=out) is out and torch.equal(out, torch.relu(x)) and out._version == version + 2
try:
    torch.ops.opforge.add.out(x.requires_grad_(), x, out=out)
except TypeError as e:
    assert "add(): 'x' is a torch tensor that requires grad, and out= does not support autograd" in str(e), e
else:
    raise AssertionError("a tensor that requires grad was accepted")
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "OPFORGE_TORCH_NATIVE": "0"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-4000:]
