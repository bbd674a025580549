"""Elementwise ops' results keep their inputs' layout (OpDef::elementwise, opforge/layout.h): a
transposed, permuted (channels-last) or sliced input gives a result whose dimensions lie in
memory in the same order, with the strides torch's own elementwise ops give (torch's rule,
torch._prims_common, as the oracle), from NumPy, torch eager, torch.ops, the fake kernel under
opcheck and torch.compile (static and dynamic shapes), autograd and JAX (row-major, as XLA's
arrays are); the forge device's in test_forge.py. Values are checked against each op's float64
reference.
"""

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch._dynamo  # noqa: E402

import opforge  # noqa: E402
import opforge.torch as ot  # noqa: E402
from op_samples import CORE, OPS, WITH_REFERENCE, reference, sample, significant, torch_strides  # noqa: E402

ELEMENTWISE = [n for n in OPS if CORE[n].elementwise]


def test_the_elementwise_ops_say_so():
    """The declaration reaches Python (opforge.ops()); ops that are not elementwise say []."""
    declared = {op["name"]: op["elementwise"] for op in opforge.ops()}
    assert {"add", "mul", "relu", "gelu", "silu", "add_one", "gelu_backward"} <= set(ELEMENTWISE)
    assert declared["add"] == ["x", "y"] and declared["gelu_backward"] == ["grad", "x"]
    assert declared["rms_norm"] == [] and declared["softmax"] == [] and declared["add_backward"] == []


def test_infer_takes_strides_and_checks_their_count():
    """The shape rule's entry point for fake kernels: strides (optional) give the results' layout."""
    add = opforge._core.op("add")
    assert add.infer([((4, 3), "float32", None, (1, 4)), ((4, 3), "float32")], {})[0][2] == (1, 4)
    assert add.infer([((4, 3), "float32"), ((4, 3), "float32")], {})[0][2] == (3, 1)
    with pytest.raises(ValueError, match=re.escape("add(): 'x' has 2 sizes but 1 strides")):
        add.infer([((4, 3), "float32", None, (1,)), ((4, 3), "float32")], {})


def permuted(tensors, order):
    """Each tensor of rank len(order) as a view with its dimensions lying in memory in `order`
    (outermost first), holding the same values; others as they are."""
    out = []
    for t in tensors:
        if t.dim() != len(order):
            out.append(t)
            continue
        inverse = np.argsort(order)
        base = t.detach().permute(*order).contiguous()
        out.append(base.permute(*inverse).requires_grad_(t.requires_grad))
    return out


def layouts(rank):
    """Some memory orders of `rank` dimensions other than row-major: reversed, the innermost
    moved outermost (channels-last's), two swapped."""
    dims = list(range(rank))
    return [dims[::-1], [0, *dims[2:], 1], [dims[-1], *dims[:-1]], [*dims[:-2], dims[-1], dims[-2]]]


def sample3(name, rng, dtype="float32", grad=False):
    """The op's sample reshaped to rank 3 (elementwise ops take any shape)."""
    tensors, attrs = sample(name, rng, dtype, rows=6, cols=20, grad=False)
    shaped = [t.reshape(3, 2, 20) if t.dim() == 2 and t.shape == (6, 20) else t for t in tensors]
    for t in shaped:
        t.requires_grad_(grad and t.is_floating_point())
    return shaped, attrs


def expected(name, tensors, attrs):
    values = [t.detach().double() for t in tensors]
    return reference(name).torch(*values, **attrs)


@pytest.mark.parametrize("name", [n for n in ELEMENTWISE if n in WITH_REFERENCE])
def test_torch_results_keep_the_inputs_layout(name, rng):
    base, attrs = sample3(name, rng)
    for order in layouts(3):
        tensors = permuted(base, order)
        want = expected(name, tensors, attrs)
        for fn in (getattr(ot, name), getattr(torch.ops.opforge, name)):
            got = fn(*tensors, **attrs)
            assert significant(got) == torch_strides(name, tensors), (order, got.stride())
            torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", [n for n in ELEMENTWISE if n in WITH_REFERENCE])
def test_cuda_results_keep_the_inputs_layout(name, rng):
    """The CUDA kernels on views reordered to the result's layout (run_kernel), float32 on torch
    CUDA tensors, against the float64 reference on the CPU."""
    base, attrs = sample3(name, rng)
    for order in layouts(3):
        tensors = [t.cuda() for t in permuted(base, order)]
        got = getattr(ot, name)(*tensors, **attrs)
        assert got.is_cuda and significant(got) == torch_strides(name, tensors), (order, got.stride())
        torch.testing.assert_close(got.double().cpu(), expected(name, [t.cpu() for t in tensors], attrs),
                                   rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["add", "mul", "gelu_backward"])
def test_the_first_operand_that_orders_the_dimensions_decides(name, rng):
    """As torch's x.T + y is laid out like x.T and y + x.T like y; a broadcast row decides nothing."""
    (a, b), attrs = sample(name, rng, "float64", rows=7, cols=9)
    at = a.detach().T.contiguous().T  # a's values, column-major
    for pair in ((at, b), (b, at), (at, b[:1]), (b[:1], at)):
        got = getattr(ot, name)(*pair, **attrs)
        assert significant(got) == torch_strides(name, pair)
        torch.testing.assert_close(got, expected(name, pair, attrs), rtol=1e-12, atol=1e-14)
    assert significant(getattr(ot, name)(b[:1], at, **attrs)) == (1, 7)


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_opcheck_on_permuted_inputs(name, rng):
    """The fake kernel gives the real kernel's strides (opcheck compares them), autograd and
    torch.compile included."""
    base, attrs = sample3(name, rng, grad=bool(CORE[name].backward))
    for order in layouts(3)[:2]:
        tensors = permuted(base, order)
        torch.library.opcheck(getattr(torch.ops.opforge, name).default, tuple(tensors), attrs)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_results_keep_the_layout(backend, dynamic, rng, fresh_dynamo):
    """A channels-last activation through gelu and add in a compiled graph: the strides and
    values of eager, for two sizes (one graph when dynamic)."""
    w = torch.randn(5, dtype=torch.float64)

    def f(x):
        return ot.add(ot.gelu(x), w)

    compiled = torch.compile(f, fullgraph=True, backend=backend, dynamic=dynamic)
    for n in (6, 10):
        x = torch.randn(2, 5, n, n, dtype=torch.float64).to(memory_format=torch.channels_last).permute(0, 2, 3, 1)
        got, want = compiled(x), f(x)
        assert got.stride() == want.stride() == torch.nn.functional.gelu(x).add(w).stride()
        torch.testing.assert_close(got, want)


def test_gradients_through_permuted_inputs(rng):
    x = torch.randn(4, 6, 8, dtype=torch.float64).permute(2, 0, 1).detach().requires_grad_()
    y = torch.randn(8, 1, 6, dtype=torch.float64, requires_grad=True)
    ot.mul(ot.silu(x), y).sin().sum().backward()
    x2, y2 = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    (torch.nn.functional.silu(x2) * y2).sin().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(y.grad, y2.grad)


@pytest.mark.parametrize("name", [n for n in ELEMENTWISE if n in WITH_REFERENCE])
@pytest.mark.parametrize("kind", ["transposed", "reversed", "sliced"])
def test_numpy_results_keep_the_inputs_layout(name, kind, rng):
    """NumPy views, backwards-stepping ones too: the result's dimensions lie in memory in the
    input's order (by stride magnitude), dense, with the reference's values."""
    arrays, attrs = reference(name).sample(rng, rows=6, cols=20)
    arrays = [np.asarray(a) for a in arrays]
    first = next(i for i, a in enumerate(arrays) if a.ndim == 2 and a.shape == (6, 20))
    a = arrays[first].reshape(3, 2, 20)
    if kind == "transposed":
        view = np.ascontiguousarray(a.transpose(2, 0, 1)).transpose(1, 2, 0)
    elif kind == "reversed":
        view = np.ascontiguousarray(a.transpose(2, 0, 1)).transpose(1, 2, 0)[::-1, :, ::-1]
    else:  # every other column of a column-major array
        view = np.asfortranarray(np.repeat(a, 2, axis=2))[:, :, ::2]
    np.testing.assert_array_equal(view, a if kind != "reversed" else a[::-1, :, ::-1])
    args = [view if i == first else (x.reshape(3, 2, 20) if x.shape == (6, 20) else x) for i, x in enumerate(arrays)]
    got = getattr(opforge, name)(*args, **attrs)
    want = reference(name).numpy(*args, **attrs)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    order = lambda x: sorted(range(x.ndim), key=lambda d: -abs(x.strides[d]))  # noqa: E731
    assert order(got) == order(view), (got.strides, view.strides)
    assert dense(got)


def dense(a) -> bool:
    """A NumPy array fills its memory: each stride, smallest first, is the product of the sizes
    of the dimensions inside it (positive: no backwards steps in a result)."""
    step = a.itemsize
    for d in sorted(range(a.ndim), key=lambda d: (a.strides[d], a.shape[d] != 1)):
        if a.shape[d] != 1 and a.strides[d] != step:
            return False
        step *= a.shape[d]
    return True


def test_jax_results_stay_row_major(rng):
    """XLA's arrays are row-major: a JAX result whose order a transposed NumPy operand decides is still one."""
    jax = pytest.importorskip("jax")
    x = np.asfortranarray(rng.standard_normal((5, 7)))
    # On the host beside the NumPy operand: where a GPU is, JAX's default device is it, and a
    # GPU array beside a host one is refused (the mixed-device error, tested elsewhere).
    y = jax.device_put(rng.standard_normal((1, 7)), jax.devices("cpu")[0])
    got = opforge.add(y, x)
    np.testing.assert_allclose(np.asarray(got), x + np.asarray(y), rtol=1e-12)
    assert opforge.add(x, x).strides == x.strides

