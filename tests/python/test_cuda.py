"""opforge's CUDA kernels through every adapter, held to one bar without naming ops: every op
with a CUDA kernel, every dtype that kernel declares, on torch CUDA tensors (the generic DLPack
path, opforge.<op>, which hands torch tensors to opforge.torch.<op>, and torch.ops.opforge.<op>),
on JAX GPU arrays under jit, and on CuPy arrays
when CuPy is installed, against the same op on the CPU and, where the op has one, its float64
reference. Then: results are ordered on torch's current stream; a config override that forces
the CPU backend makes a GPU array a clear error; bad inputs on the GPU raise typed exceptions.

Skipped without a CUDA device. OPFORGE_TEST_DEVICE=cpu runs the same bodies on CPU tensors
against the CPU backend, which checks the tests' own plumbing on a machine without a GPU (the
comparisons are then CPU against CPU; the stream and mixed-device tests skip).
"""

import importlib
import os
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import opforge  # noqa: E402
import opforge.torch  # noqa: E402,F401  (defines torch.ops.opforge)
from opforge.testing import COMPUTE_EPS, FLOAT_DTYPES, TOLERANCES  # noqa: E402
from op_samples import backward_values  # noqa: E402

DEVICE = os.environ.get("OPFORGE_TEST_DEVICE", "cuda")
assert DEVICE in ("cuda", "cpu"), f"OPFORGE_TEST_DEVICE must be cuda or cpu, got {DEVICE!r}"
ON_GPU = DEVICE == "cuda"
pytestmark = pytest.mark.skipif(ON_GPU and not torch.cuda.is_available(), reason="needs a CUDA device")

OPS = opforge._core.op_names()
CORE = {name: opforge._core.op(name) for name in OPS}
FORWARD_OF = {CORE[n].backward[0]: n for n in OPS if CORE[n].backward}
SAVING_OF = {CORE[n].saving_forward[0]: n for n in OPS if CORE[n].saving_forward}
# opforge.<op> without its routes: the generic DLPack path, which CuPy and other arrays take.
GENERIC = {n: opforge._core.function(CORE[n]) for n in OPS}


def kernel_dtypes(name):
    """Dtypes of the op's kernel on the backend under test ([] when it has none)."""
    return next((k["dtypes"] for k in CORE[name].kernels if k["backend"] == DEVICE), [])


DEVICE_OPS = [n for n in OPS if kernel_dtypes(n)]
# Ops whose GPU kernel promises the CPU kernel's bits: the ggml formats by contract, and these
# sums in the CPU's order (scatter_add's comment) or single roundings (add, mul).
EXACT = {"quantize_q8_0", "quantize_q4_0", "dequantize", "matmul_q"}
EXACT_WIDE = {"scatter_add", "add", "mul"}  # in float32 / float64 and the integer types
QUANT_FORMATS = {"dequantize", "matmul_q"}


def has_reference(name):
    return importlib.util.find_spec(f"opforge.references.{name}") is not None


def reference(name):
    return importlib.import_module(f"opforge.references.{name}")


def tensor_names(name):
    return [a["name"] for a in CORE[name].args if a["kind"].startswith("Tensor")]


# ---------------------------------------------------------------------------------------------
# Inputs: each op's reference sample; ops without one get theirs here; backward ops are fed
# from their forward op (cotangent drawn like the forward result). All made on the CPU.

def blocks_of_32(rng, rows, blocks):
    """Normal values with per-block scales over 1e-3..1e3 (fp16 scales vary widely), one block of
    zeros and one of -0.0: the quantizers' special cases."""
    x = rng.standard_normal((rows, 32 * blocks)) * 10.0 ** rng.uniform(-3, 3, (rows, blocks)).repeat(32, axis=1)
    x[0, :32] = 0.0
    if x.size > 32:
        x.reshape(-1)[32:64] = -0.0
    return x


def quant_weights(rng, n, k, fmt):
    w = rng.standard_normal((n, k)).astype(np.float32)
    return getattr(opforge, f"quantize_{fmt}")(w)


SAMPLES = {  # (rng, rows, cols, fmt) -> (arrays, attrs); cols is rounded to blocks of 32
    "quantize_q8_0": lambda rng, rows, cols, fmt: ([blocks_of_32(rng, rows, cols // 32 + 1)], {}),
    "quantize_q4_0": lambda rng, rows, cols, fmt: ([blocks_of_32(rng, rows, cols // 32 + 1)], {}),
    "dequantize": lambda rng, rows, cols, fmt: (
        [getattr(opforge, f"quantize_{fmt}")(blocks_of_32(rng, rows, cols // 32 + 1).astype(np.float32))],
        {"format": fmt}),
    "matmul_q": lambda rng, rows, cols, fmt: (
        [rng.standard_normal((rows, 32 * (cols // 32 + 1))), quant_weights(rng, 7, 32 * (cols // 32 + 1), fmt)],
        {"format": fmt}),
    "scatter_add": lambda rng, rows, cols, fmt: (
        [rng.standard_normal((rows * 3, cols)), rng.integers(0, rows, rows * 3)], {"dim_size": rows, "dim": 0}),
}


def sample(name, rng, dtype, fmt=None, rows=5, cols=33):
    """(CPU tensors in schema order, attrs) for `name` in `dtype`."""
    if name in SAMPLES:
        arrays, attrs = SAMPLES[name](rng, rows, cols, fmt)
    elif has_reference(name):
        arrays, attrs = reference(name).sample(rng, rows=rows, cols=cols)
    elif name in SAVING_OF:  # a saving forward takes its op's arguments
        return sample(SAVING_OF[name], rng, dtype, fmt, rows, cols)
    elif name in FORWARD_OF:
        forward = FORWARD_OF[name]
        args, attrs = sample(forward, rng, dtype, fmt, rows, cols)
        values = backward_values(forward, args, attrs, rng)
        own = {a["name"] for a in CORE[name].args}  # the backward may take fewer attributes
        return [values[n] for n in tensor_names(name)], {k: v for k, v in attrs.items() if k in own}
    else:
        pytest.fail(f"{name} has a {DEVICE} kernel but no sample: add one to SAMPLES in {__file__}")

    def convert(a):  # float64 data becomes `dtype`; indices and quantized bytes keep their own
        a = np.asarray(a)
        if a.dtype != np.float64:
            return torch.from_numpy(np.ascontiguousarray(a))
        if dtype.startswith("int"):
            a = rng.integers(-1000, 1000, a.shape)
        return torch.from_numpy(a).to(getattr(torch, dtype))

    return [convert(a) for a in arrays], attrs


def cases():
    out = []
    for n in DEVICE_OPS:
        for d in kernel_dtypes(n):
            for fmt in (("q8_0", "q4_0") if n in QUANT_FORMATS else (None,)):
                out.append(pytest.param(n, d, fmt, id="-".join(filter(None, (n, d, fmt)))))
    return out


def as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def assert_matches(got, want, name, dtype):
    """`got` (any device) equals the CPU result `want`: bit for bit where the op promises it,
    else within the dtype's tolerance (the kernels may sum in another order)."""
    got, want = as_tuple(got), as_tuple(want)
    assert len(got) == len(want)
    exact = name in EXACT or (name in EXACT_WIDE and dtype not in ("float16", "bfloat16"))
    for g, w in zip(got, want):
        g = g.cpu()
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        if exact or not w.is_floating_point():
            assert torch.equal(g, w), f"{name}: {(g != w).sum().item()} of {w.numel()} elements differ"
        else:
            rtol, atol = TOLERANCES[str(w.dtype).removeprefix("torch.")]
            torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True)


def poisoned_like(t):
    """A tensor like `t` holding what no kernel writes there: NaN, or 77 in integer types."""
    return torch.full_like(t, float("nan")) if t.is_floating_point() else torch.full_like(t, 77)


def cpu_result(name, tensors, attrs):
    return getattr(torch.ops.opforge, name)(*tensors, **attrs)


# ---------------------------------------------------------------------------------------------

def test_cuda_backend_is_available():
    """A GPU is present (or this is the CPU dry run): opforge must have been built with CUDA and
    see the device, else every test below would quietly run nothing on the GPU."""
    if not ON_GPU:
        pytest.skip("dry run on the CPU")
    cuda = next(b for b in opforge.backends() if b["name"] == "cuda")
    assert opforge.info()["built_with_cuda"], "opforge was built without CUDA (no nvcc at build time?)"
    assert cuda["available"], cuda["reason"]
    missing = sorted(set(OPS) - set(DEVICE_OPS))
    assert not missing, f"ops without a CUDA kernel: {missing}"


@pytest.mark.parametrize("name, dtype, fmt", cases())
def test_torch_tensors_match_cpu(name, dtype, fmt, rng):
    tensors, attrs = sample(name, rng, dtype, fmt)
    want = cpu_result(name, tensors, attrs)
    on_device = [t.to(DEVICE) for t in tensors]
    for fn in (GENERIC[name], getattr(opforge, name), getattr(torch.ops.opforge, name)):
        got = fn(*on_device, **attrs)
        for g in as_tuple(got):
            assert isinstance(g, torch.Tensor) and g.device.type == DEVICE, (fn, g.device)
        assert_matches(got, want, name, dtype)
    # out=: the results written into tensors on the device (poisoned, so a missed element shows)
    out = tuple(poisoned_like(g) for g in as_tuple(got))
    written = getattr(opforge, name)(*on_device, **attrs, out=out)
    assert all(w is o for w, o in zip(written, out))
    assert_matches(written, want, name, dtype)
    if has_reference(name) and dtype in FLOAT_DTYPES:  # and against the float64 reference
        values = [t.double() if t.is_floating_point() else t for t in tensors]
        ref = as_tuple(reference(name).torch(*values, **attrs))
        rtol, atol = TOLERANCES[dtype]
        for g, r in zip(as_tuple(got), ref):
            np.testing.assert_allclose(g.double().cpu().numpy(), r.numpy(), rtol=rtol, atol=atol)


def jax_device():
    """The JAX device under test, or None where JAX has none (a CPU-only jaxlib on a GPU host)."""
    try:
        import jax
    except ImportError:
        return None
    try:
        return jax.devices("gpu" if ON_GPU else "cpu")[0]
    except RuntimeError:
        return None


def to_jax(t, device):
    import jax
    import jax.numpy as jnp

    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: widen exactly, narrow in JAX
        return jax.device_put(jnp.asarray(t.float().numpy()).astype(jnp.bfloat16), device)
    return jax.device_put(t.numpy(), device)


@pytest.mark.parametrize("name, dtype, fmt", cases())
def test_jax_arrays_under_jit_match_cpu(name, dtype, fmt, rng):
    device = jax_device()
    if device is None:
        pytest.skip("jax has no GPU device here" if ON_GPU else "jax is not installed")
    import jax
    import jax.numpy as jnp
    import opforge.jax as oj

    tensors, attrs = sample(name, rng, dtype, fmt)
    want = cpu_result(name, tensors, attrs)
    args = [to_jax(t, device) for t in tensors]
    got = jax.jit(lambda *a: getattr(oj, name)(*a, **attrs))(*args)
    back = []
    for g in as_tuple(got):
        assert device in g.devices(), (g.devices(), device)
        if g.dtype == jnp.bfloat16:
            back.append(torch.from_numpy(np.asarray(g.astype(jnp.float32))).to(torch.bfloat16))
        else:
            back.append(torch.from_numpy(np.array(g)))  # a writable copy
    assert_matches(tuple(back), want, name, dtype)


@pytest.mark.parametrize("name, dtype, fmt", [c for c in cases() if c.values[1] != "bfloat16"])
def test_cupy_arrays_on_a_side_stream_match_cpu(name, dtype, fmt, rng):
    if not ON_GPU:
        pytest.skip("CuPy arrays live on the GPU")
    cupy = pytest.importorskip("cupy")  # CuPy has no bfloat16: those cases are left out above
    tensors, attrs = sample(name, rng, dtype, fmt)
    want = cpu_result(name, tensors, attrs)
    args = [cupy.asarray(t.numpy()) for t in tensors]
    cupy.cuda.Device().synchronize()  # the copies above ran on CuPy's default stream
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:  # opforge takes CuPy's current stream through the DLPack path
        got = getattr(opforge, name)(*args, **attrs)
        # and writes into CuPy arrays given as out= there (made on the stream, poisoned)
        out = tuple(cupy.asarray(poisoned_like(w).numpy()) for w in as_tuple(want))
        written = getattr(opforge, name)(*args, **attrs, out=out)
    stream.synchronize()
    assert all(w is o for w, o in zip(written, out))
    for result in (got, written):
        back = []
        for g in as_tuple(result):
            assert isinstance(g, cupy.ndarray), type(g)
            back.append(torch.from_numpy(cupy.asnumpy(g)))
        assert_matches(tuple(back), want, name, dtype)


@pytest.mark.parametrize("path", ["generic", "opforge", "torch.ops", "out="])
@pytest.mark.parametrize("name", [n for n in DEVICE_OPS if "float32" in kernel_dtypes(n)])
def test_runs_on_torch_current_stream(name, path, rng):
    """On a side stream, the inputs get their values only after a ~50 ms busy kernel. A kernel
    launched on any other stream (the legacy default one, say: torch's side streams do not
    wait for it) would read the zeros that were there before and give another result."""
    if not ON_GPU:
        pytest.skip("streams need a GPU")
    tensors, attrs = sample(name, rng, "float32", "q4_0")
    want = cpu_result(name, tensors, attrs)
    out = tuple(poisoned_like(w).cuda() for w in as_tuple(want))  # written on the side stream below
    fn = {"generic": GENERIC[name], "opforge": getattr(opforge, name), "torch.ops": getattr(torch.ops.opforge, name),
          "out=": lambda *args, **kw: getattr(opforge, name)(*args, **kw, out=out)}[path]
    real = [t.cuda() for t in tensors]
    placeholders = [torch.zeros_like(t) for t in real]  # zeros: a valid index, and other results
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # cycles: ~50 ms at 2 GHz
        for p, t in zip(placeholders, real):
            p.copy_(t)
        got = tuple(g.clone() for g in as_tuple(fn(*placeholders, **attrs)))  # ordered after the op
    side.synchronize()
    assert_matches(got, want, name, "float32")


# scatter_add and its backward check the index on the host (a synchronize), which a CUDA graph
# capture does not allow: they raise there instead.
CAPTURABLE = [n for n in DEVICE_OPS if "float32" in kernel_dtypes(n) and not n.startswith("scatter_add")]


@pytest.mark.parametrize("name", CAPTURABLE)
def test_cuda_graph_capture_and_replay(name, rng):
    """torch.ops.opforge ops inside a CUDA graph (what torch.compile's reduce-overhead mode and
    serving loops record): captured on torch's capture stream, workspaces from torch's graph pool,
    then replayed on new inputs copied into the captured ones, matching the CPU on those."""
    op = getattr(torch.ops.opforge, name)
    tensors, attrs = sample(name, rng, "float32", "q4_0")
    fresh, _ = sample(name, rng, "float32", "q4_0")
    static = [t.to(DEVICE) for t in tensors]
    if ON_GPU:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture (cuBLASLt's heuristic, first uses)
            for _ in range(2):
                op(*static, **attrs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = as_tuple(op(*static, **attrs))
        for s_, f in zip(static, fresh):
            s_.copy_(f)
        graph.replay()
        torch.cuda.synchronize()
    else:  # the CPU run checks the test's own plumbing: the same op on the copied inputs
        for s_, f in zip(static, fresh):
            s_.copy_(f)
        out = as_tuple(op(*static, **attrs))
    assert_matches(out, cpu_result(name, fresh, attrs), name, "float32")


@pytest.mark.parametrize("name", ["scatter_add", "scatter_add_backward"])
def test_index_checking_ops_refuse_a_graph_capture_cleanly(name, rng):
    """scatter_add's index check waits for the device, which a capture forbids: inside one it
    raises opforge's NotImplementedError naming the op before waiting (RuntimeError where no
    autograd kernel re-raises it typed, as for the backward op), so the capture still ends cleanly
    and the stream stays usable."""
    tensors, attrs = sample(name, rng, "float32")
    static = [t.to(DEVICE) for t in tensors]
    if ON_GPU:  # (the CPU run checks the rest: the samples and the call after)
        graph = torch.cuda.CUDAGraph()
        with pytest.raises((NotImplementedError, RuntimeError), match=rf"{name}\(\): cannot run inside a CUDA graph"):
            with torch.cuda.graph(graph):
                getattr(torch.ops.opforge, name)(*static, **attrs)
    assert_matches(getattr(torch.ops.opforge, name)(*static, **attrs), cpu_result(name, tensors, attrs), name,
                   "float32")


MASKED = [n for n in DEVICE_OPS if any(a["name"] == "output_mask" for a in CORE[n].args)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", MASKED)
def test_output_masks_on_the_device(name, dtype, rng):
    """A backward op asked for some of its results (OpDef::output_mask_slot) computes exactly
    those, as the full call does, and returns the others empty; the kernels skip empty results."""
    tensors, attrs = sample(name, rng, dtype, rows=37, cols=65)
    tensors = [t if t is None else t.to(DEVICE) for t in tensors]
    op = getattr(torch.ops.opforge, name)
    full = op(*tensors, **attrs)
    for mask in range(1 << len(full)):
        got = op(*tensors, **attrs, output_mask=mask)
        for i, (g, f) in enumerate(zip(got, full)):
            if mask >> i & 1:
                assert torch.equal(g, f), (mask, i)
            else:
                assert g.shape == (0,) and g.device == f.device, (mask, i)


def test_autocast_on_the_device(rng):
    """torch.autocast on this device casts opforge ops by their declared policies (OpDef::autocast),
    bit for bit as the op on inputs cast by hand."""
    low = torch.float16 if ON_GPU else torch.bfloat16
    x, w, g = (torch.from_numpy(rng.standard_normal(s)).float().to(DEVICE) for s in ((9, 64), (32, 64), (32,)))
    with torch.autocast(DEVICE, dtype=low):
        h = opforge.torch.linear_act(x, w, act="gelu")
        n = opforge.torch.rms_norm(h, g)
        s = opforge.torch.add(h, g)
    assert h.dtype == low and torch.equal(h, opforge.torch.linear_act(x.to(low), w.to(low), act="gelu"))
    assert n.dtype == torch.float32 and torch.equal(n, opforge.torch.rms_norm(h.float(), g))
    assert s.dtype == torch.float32 and torch.equal(s, opforge.torch.add(h.float(), g))


@pytest.fixture
def restore_backend():
    yield
    for op in [None] + OPS:
        opforge.set_backend(None, op)


def test_forced_cpu_backend_rejects_gpu_arrays(restore_backend, rng):
    """Forcing the other backend is an error naming the override, never a silent copy."""
    other = "cpu" if ON_GPU else "cuda"
    x = torch.from_numpy(rng.standard_normal((4, 32))).float().to(DEVICE)
    message = f"quantize_q8_0(): backend '{other}' (forced by set_backend()) cannot run on {DEVICE} tensors"
    opforge.set_backend(other, "quantize_q8_0")
    for fn in (opforge.quantize_q8_0, torch.ops.opforge.quantize_q8_0):
        with pytest.raises(RuntimeError, match=re.escape(message)):
            fn(x)
    assert torch.equal(opforge.add(x, x).cpu(), (x + x).cpu())  # other ops keep their backend
    device = jax_device()
    if device is not None:  # through XLA: the handler reports it, the op's name in the message
        import opforge.jax as oj

        with pytest.raises(Exception, match=re.escape(message)):
            oj.quantize_q8_0(to_jax(x.cpu(), device)).block_until_ready()
    opforge.set_backend(None, "quantize_q8_0")
    assert torch.equal(opforge.quantize_q8_0(x).cpu(), opforge.quantize_q8_0(x.cpu()))


def test_env_override_forcing_cpu_rejects_gpu_arrays():
    if not ON_GPU:
        pytest.skip("needs a GPU array")
    code = ("import torch, opforge\n"  # the generic path, then the torch op opforge.add_one routes to
            "for fn in (opforge._core.function(opforge._core.op('add_one')), opforge.add_one):\n"
            "    try:\n        fn(torch.ones(3, device='cuda'))\n"
            "    except RuntimeError as e:\n        print(str(e).splitlines()[0])\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPFORGE_")}
    proc = subprocess.run([sys.executable, "-c", code], env={**env, "OPFORGE_BACKEND": "cpu"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["add_one(): backend 'cpu' (forced by OPFORGE_BACKEND) cannot run on cuda tensors"] * 2


def gpu_only():
    if not ON_GPU:
        pytest.skip("needs tensors on two kinds of device")


@pytest.mark.parametrize("fn", [lambda: GENERIC["add"], lambda: opforge.add, lambda: torch.ops.opforge.add],
                         ids=["generic", "opforge", "torch.ops"])
def test_mixed_devices_raise(fn):
    gpu_only()
    x, y = torch.ones(3, device="cuda"), torch.ones(3)
    with pytest.raises(RuntimeError, match=re.escape(
            "add(): 'y' is on cpu but 'x' is on cuda:0; all tensors must be on one device")):
        fn()(x, y)
    w = opforge.quantize_q4_0(torch.ones(5, 64))
    with pytest.raises(RuntimeError, match=r"matmul_q\(\): 'w' is on cpu but 'x' is on cuda:0"):
        opforge.matmul_q(torch.ones(2, 64, device="cuda"), w, "q4_0")


def test_out_on_another_device_raises():
    gpu_only()
    x = torch.ones(3, device="cuda")
    with pytest.raises(RuntimeError, match=re.escape(
            "add(): 'out' is on cpu but the inputs are on cuda:0; all tensors must be on one device")):
        opforge.add(x, x, out=torch.empty(3))
    with pytest.raises(RuntimeError, match=re.escape(
            "add(): 'out' is on cuda:0 but the inputs are on cpu; all tensors must be on one device")):
        opforge.add(x.cpu(), x.cpu(), out=torch.empty(3, device="cuda"))


@pytest.mark.parametrize("call, error, message", [
    (lambda d: opforge.rms_norm(torch.ones(2, 4, device=d), torch.ones(3, device=d)), ValueError,
     r"rms_norm(): 'weight' must have shape [4], got [3]"),
    (lambda d: opforge.matmul_q(torch.ones(2, 48, device=d), torch.zeros(5, 36, dtype=torch.uint8, device=d), "q4_0"),
     ValueError, "matmul_q(): 'x' last dimension must be a multiple of 32, got 48"),
    (lambda d: torch.ops.opforge.dequantize(torch.zeros(3, 36, dtype=torch.uint8, device=d), "q5_0"), ValueError,
     "dequantize(): 'format' must be 'q8_0' or 'q4_0', got 'q5_0'"),
    (lambda d: torch.ops.opforge.quantize_q4_0(torch.ones(2, 64, dtype=torch.float64, device=d)), TypeError,
     "quantize_q4_0(): 'x' must have dtype in [float32, float16, bfloat16], got float64"),
    # The index is checked on the device; the first bad position comes back after the op's kernels
    # (which stay in bounds meanwhile), also where the result is empty.
    (lambda d: opforge.scatter_add(torch.ones(4, 3, device=d), torch.tensor([0, 1, 7, 9], device=d), 5), ValueError,
     "scatter_add(): 'index' must hold values in [0, dim_size) = [0, 5), got 7 at position 2"),
    (lambda d: opforge.scatter_add(torch.ones(4, 3, device=d), torch.tensor([0, 1, -7, 9], device=d), 0), ValueError,
     "scatter_add(): 'index' must hold values in [0, dim_size) = [0, 0), got 0 at position 0"),
    (lambda d: opforge.scatter_add_backward(torch.ones(4, 3, device=d), torch.tensor([0, -1, 9], device=d)), ValueError,
     "scatter_add_backward(): 'index' must hold values in [0, grad.shape[dim]) = [0, 4), got -1 at position 1"),
    (lambda d: opforge.scatter_add_backward(torch.ones(4, 0, device=d), torch.tensor([0, 9], device=d)), ValueError,
     "scatter_add_backward(): 'index' must hold values in [0, grad.shape[dim]) = [0, 4), got 9 at position 1"),
])
def test_bad_inputs_raise_typed_errors(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call(DEVICE)


# ---------------------------------------------------------------------------------------------
# The quantized ops at the shapes that stress the GPU kernels' tiling: up to 8 rows a warp per
# column, 32 blocks at a time; 9 to 63 rows in tiles of 32 rows x 16 columns, 16 blocks at a time;
# from 64 rows the tensor-core tiles of 64 rows x 32 columns, 8 blocks at a time (and partial ones
# of each), row tiles past gridDim.y's 65535; strides. Rows of a multiple of 8 blocks (k a multiple
# of 256) load the weights as 16-byte pieces through shared memory; the others block by block. One
# row of up to 256 blocks is quantized inside the gemv, a longer one by the quantizer first.

MATMUL_SHAPES = [pytest.param(m, k, n, id=f"m{m}-k{k}-n{n}") for m, k, n in
                 [(1, 4096, 33), (32, 4096, 17), (9, 544, 100), (70, 64, 5), (3, 1056, 9), (8, 1056, 40),
                  (4, 1024, 40), (96, 512, 40), (1, 8224, 5),
                  (37, 608, 21), (130, 352, 70), (512, 4096, 96), (32 * 65535 + 9, 32, 3)]]


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("m, k, n", MATMUL_SHAPES)
def test_matmul_q_bits_match_cpu_at_tile_edges(m, k, n, fmt, rng):
    x = torch.from_numpy(rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-2, 2, (m, 1))).float()
    w = torch.from_numpy(quant_weights(rng, n, k, fmt))
    got = opforge.matmul_q(x.to(DEVICE), w.to(DEVICE), fmt)
    assert torch.equal(got.cpu(), opforge.matmul_q(x, w, fmt))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_quantized_ops_on_strided_inputs(dtype, rng):
    base = torch.from_numpy(blocks_of_32(rng, 6, 9)).to(getattr(torch, dtype))
    x = base.to(DEVICE)[1::2, ::3]  # rows 1, 3, 5; every third element: inner stride 3
    assert not x.is_contiguous() and x.shape == (3, 96)
    xt = base.to(DEVICE).t().contiguous().t()  # column-major
    # Contiguous but one element past a 16-byte boundary: the quantizers' element loads, not vectors.
    flat = torch.zeros(base.numel() + 1, dtype=base.dtype, device=DEVICE)
    flat[1:] = base.reshape(-1).to(DEVICE)
    shifted = flat[1:].view(base.shape)
    assert shifted.is_contiguous() and shifted.data_ptr() % 16 != 0
    for fmt in ("q8_0", "q4_0"):
        quantize = getattr(opforge, f"quantize_{fmt}")
        assert torch.equal(quantize(shifted).cpu(), quantize(base))
        for view in (x, xt):
            assert torch.equal(quantize(view).cpu(), quantize(view.cpu()))
        w = quant_weights(rng, 10, 96, fmt)
        tall = torch.zeros((20, w.shape[1]), dtype=torch.uint8)
        tall[::2] = torch.from_numpy(w)
        for wv in (tall.to(DEVICE)[::2], torch.from_numpy(w).to(DEVICE).t().contiguous().t(),
                   torch.from_numpy(np.ascontiguousarray(w)).to(DEVICE)[:, :]):
            assert torch.equal(opforge.matmul_q(x, wv, fmt).cpu(), opforge.matmul_q(x.cpu(), wv.cpu(), fmt))
            assert torch.equal(opforge.dequantize(wv, fmt).cpu(), opforge.dequantize(wv.cpu(), fmt))
        # A weight view starting at an odd byte: the kernel's 16-bit loads must fall back to bytes.
        odd = torch.zeros(w.size + 1, dtype=torch.uint8)
        odd[1:] = torch.from_numpy(w.reshape(-1))
        wv = odd.to(DEVICE)[1:].view(w.shape)
        assert torch.equal(opforge.matmul_q(x, wv, fmt).cpu(), opforge.matmul_q(x.cpu(), torch.from_numpy(w), fmt))


def test_quantize_ties_and_fragile_values(rng):
    """Values on the rounding boundaries (x * id exactly half-integers, from the CPU tests) give
    the CPU's bytes on the device too."""
    ties = np.concatenate([[-8.0], np.arange(-7.5, 8.0, 0.5)])
    q8_ties = np.concatenate([[127.0], np.arange(-15.5, 15.5, 1.0)])
    pair = np.zeros(32)
    pair[[5, 9]] = [3.0, -3.0]
    x = torch.from_numpy(np.concatenate([ties, q8_ties, pair, -pair, np.zeros(32), blocks_of_32(rng, 1, 64)[0]]))
    x = x.float()
    for fmt in ("q8_0", "q4_0"):
        quantize = getattr(opforge, f"quantize_{fmt}")
        assert torch.equal(quantize(x.to(DEVICE)).cpu(), quantize(x))


@pytest.fixture(params=["cublaslt", "own"])
def matmul_library(request):
    """linear_act's CUDA forward through cuBLASLt (the default where it loads) and through
    opforge's own kernels (cuBLASLt off); on the CPU dry run both are the CPU kernel."""
    before = opforge._core.set_cublaslt(request.param == "cublaslt")
    yield request.param
    opforge._core.set_cublaslt(before)


def test_cublaslt_is_loaded_beside_torch():
    """torch's CUDA build loads libcublasLt at import; opforge uses that copy (opforge.info())."""
    status = opforge.info()["cublaslt"]
    if not ON_GPU:
        pytest.skip(f"cuBLASLt is for GPU arrays (here: {status})")
    assert status.startswith("cuBLASLt "), status


# The float32 product's tiles (sgemm_nt.cuh: 128 x 128, K in steps of 8, float4 loads) against its
# edges: M and N one short of, at and one past a tile, K a multiple of 4 but not of 8, one row;
# and the layouts that take the other kernel (K not a multiple of 4, rows not 16-byte aligned).
LINEAR_SHAPES = [(1, 4, 1), (5, 1, 3), (127, 36, 129), (128, 8, 128), (129, 260, 255), (300, 64, 17), (64, 30, 70)]


@pytest.mark.parametrize("act", ["none", "gelu"])
@pytest.mark.parametrize("m, k, n", LINEAR_SHAPES, ids=lambda v: str(v))
def test_linear_act_float32_tiles(m, k, n, act, matmul_library, rng):
    x = torch.from_numpy(rng.standard_normal((m, k + 4))).float()
    w = torch.from_numpy(rng.standard_normal((n, k))).float()
    b = torch.from_numpy(rng.standard_normal(n)).float()
    xd = x.to(DEVICE)
    # rows k + 4 apart: 16-byte aligned when k % 4 == 0, then one element in (not aligned), then
    # an aligned start with rows k + 2 apart (the second row not aligned)
    for view in (xd[:, :k], xd[:, 1:k + 1], xd.reshape(-1)[: m * (k + 2)].reshape(m, k + 2)[:, :k]):
        want = view.cpu().double() @ w.double().T + b.double()
        want = torch.nn.functional.gelu(want) if act == "gelu" else want
        got = opforge.torch.linear_act(view, w.to(DEVICE), b.to(DEVICE), act=act).cpu()
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4 * k ** 0.5)


def activate(z, act):
    if act == "gelu_tanh":
        return torch.nn.functional.gelu(z, approximate="tanh")
    return {"none": lambda v: v, "relu": torch.relu, "gelu": torch.nn.functional.gelu,
            "silu": torch.nn.functional.silu}[act](z)


def slope_at(p, act):
    """act'(p) in float64, a constant to autograd."""
    p = p.clone().requires_grad_()
    return torch.autograd.grad(activate(p, act).sum(), p)[0]


def labelled(label):
    """assert_close's msg: the label before its own message (a plain string would replace it, and
    with it the mismatch's numbers)."""
    return lambda message: f"{label}: {message}"


def rounded_once(dtype):
    """(rtol, atol) for a result computed in float (double) and rounded once to dtype, against a
    float64 reference: TOLERANCES, with rtol at least a rounding's worst case in the half types
    (2^-11 float16, 2^-8 bfloat16, doubled)."""
    rtol, atol = TOLERANCES[dtype]
    return max(rtol, {"float16": 2.0**-10, "bfloat16": 2.0**-7}.get(dtype, 0.0)), atol


def linear_reference(x, w, b, act):
    return activate(torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double()), act)


def linear_layouts(rng, t):
    """(name, x, weight, bias) on the device: the plain layout, and views each library must read
    as they are or decline (then opforge's own kernel runs): a transposed weight, x transposed,
    3-D x whose leading dims merge or do not, rows broadcast (stride 0), a strided bias, no bias."""
    m, k, n = 37, 70, 45
    def dev(*shape):
        return torch.from_numpy(rng.standard_normal(shape) / np.sqrt(shape[-1])).to(t).to(DEVICE)
    x, w, b = dev(m, k), dev(n, k), dev(n)
    x3 = dev(3, 8, k)
    yield "plain", x, w, b
    yield "weight_t", x, dev(k, n).T, b
    yield "x_t", dev(k, m).T, w, b
    yield "x_3d", x3, w, b
    yield "x_3d_unmerged", x3[:, 1:7], w, b
    yield "rows_broadcast", x[:1].expand(m, k), w, b
    yield "bias_strided", x, w, dev(2 * n)[::2]
    yield "bias_unaligned", x, w, dev(n + 1)[1:]
    yield "no_bias", x, w, None


CUBLASLT_LAYOUTS = {"plain", "weight_t", "x_t", "x_3d", "no_bias", "bias_strided", "bias_unaligned"}


def cublaslt_loaded():
    return opforge.info()["cublaslt"].startswith("cuBLASLt ")


@pytest.mark.parametrize("preact", [False, True], ids=["linear_act", "with_preact"])
@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_linear_act_libraries_and_layouts(dtype, act, preact, matmul_library, rng):
    """Every dtype, activation and layout through cuBLASLt and through opforge's own kernels
    against a float64 reference: each result rounded once from the accumulation type (so a half
    type's error is about one rounding of the result plus the float sums')."""
    rtol, atol = rounded_once(dtype)
    atol += 16 * COMPUTE_EPS[dtype] * 70 ** 0.5  # sums of k = 70 terms of size ~1
    for name, x, w, b in linear_layouts(rng, getattr(torch, dtype)):
        want = linear_reference(x.cpu(), w.cpu(), None if b is None else b.cpu(), act)
        taken = opforge._core.cublaslt_calls()[0]
        if preact:
            got, z = torch.ops.opforge.linear_act_with_preact(x, w, b, act=act)
            want_z = linear_reference(x.cpu(), w.cpu(), None if b is None else b.cpu(), "none")
            torch.testing.assert_close(z.cpu().double(), want_z, rtol=rtol, atol=atol, msg=labelled(name))
        else:
            got = opforge.torch.linear_act(x, w, b, act=act)
        assert got.dtype == x.dtype and got.shape == want.shape, name
        torch.testing.assert_close(got.cpu().double(), want, rtol=rtol, atol=atol, msg=labelled(name))
        # The path taken: never cuBLASLt when off; cuBLASLt for the layouts it reads (where it
        # loads) in float32 and float64 (the half types' rows here, 140 bytes apart, may leave
        # cuBLASLt without an algorithm: test_cublaslt_takes_aligned_half_types)
        ran = opforge._core.cublaslt_calls()[0] > taken
        if matmul_library == "own" or not ON_GPU:
            assert not ran, name
        elif cublaslt_loaded() and name in CUBLASLT_LAYOUTS and dtype in ("float32", "float64"):
            assert ran, f"{name}: cuBLASLt declined ({opforge._core.cublaslt_calls()} taken, declined)"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cublaslt_takes_aligned_half_types(dtype, rng):
    """Tensor-core shapes (every row 16-byte aligned) in a half type go through cuBLASLt, forward
    and backward, and match float64."""
    if not (ON_GPU and cublaslt_loaded()):
        pytest.skip("cuBLASLt runs on a GPU where it loads")
    t = getattr(torch, dtype)
    shapes = ((64, 128), (96, 128), (96,), (64, 96))  # x, weight, bias, cotangent
    x, w, b, g = (torch.from_numpy(rng.standard_normal(s) / 8).to(t).to(DEVICE) for s in shapes)
    taken = opforge._core.cublaslt_calls()[0]
    y = opforge.torch.linear_act(x, w, b, act="gelu")
    grads = torch.ops.opforge.linear_act_backward(g, x, w, b, None, act="gelu")
    assert opforge._core.cublaslt_calls()[0] >= taken + 4  # forward, z, grad_x and grad_weight's (two parts each)
    rtol = rounded_once(dtype)[0]
    want_y = linear_reference(x.cpu(), w.cpu(), b.cpu(), "gelu")
    torch.testing.assert_close(y.cpu().double(), want_y, rtol=rtol, atol=1e-3)
    leaves = [v.cpu().double().requires_grad_() for v in (x, w, b)]
    want = torch.autograd.grad(activate(torch.nn.functional.linear(*leaves), "gelu"), leaves, g.cpu().double())
    for got, wnt in zip(grads, want):
        torch.testing.assert_close(got.cpu().double(), wnt, rtol=rtol, atol=4e-3)


@pytest.mark.parametrize("saved_preact", [True, False])
def test_float16_gradients_past_its_range_through_cublaslt(saved_preact, rng):
    """float16 cotangents near its largest value through gelu's slope (1.127 at 1.5) make a float
    g past 65504: cuBLASLt's float16 parts of g must hold it (they hold g / 2), where rounding g
    to float16 made inf, then NaN in every gradient."""
    if not (ON_GPU and cublaslt_loaded()):
        pytest.skip("cuBLASLt runs on a GPU where it loads")
    x, w = (torch.from_numpy(rng.standard_normal(s) * 1e-3).half() for s in ((32, 128), (64, 128)))
    b = torch.from_numpy(1.5 + 0.05 * rng.standard_normal(64)).half()
    g = torch.from_numpy(rng.uniform(59000, 64000, (32, 64))).half()
    preact = torch.nn.functional.linear(x.double(), w.double(), b.double()).half() if saved_preact else None
    taken = opforge._core.cublaslt_calls()[0]
    on_gpu = [t.to(DEVICE) if t is not None else None for t in (g, x, w, b, preact)]
    grads = torch.ops.opforge.linear_act_backward(*on_gpu, act="gelu")
    assert opforge._core.cublaslt_calls()[0] >= taken + 4
    z = preact.double() if saved_preact else torch.nn.functional.linear(x.double(), w.double(), b.double())
    gz = g.double() * torch.func.grad(lambda v: torch.nn.functional.gelu(v).sum())(z)
    assert gz.abs().max() > 65504  # the case this test is for
    want = (gz @ w.double(), gz.T @ x.double())
    for got, wnt in zip(grads, want):
        torch.testing.assert_close(got.cpu().double(), wnt, rtol=rounded_once("float16")[0], atol=0.5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_linear_act_keeps_nan(dtype, matmul_library, rng):
    """A NaN in x makes its row NaN after every activation, relu included (cuBLASLt's relu
    epilogue, max(x, 0), would make it 0; torch.relu keeps it)."""
    t = getattr(torch, dtype)
    x = torch.from_numpy(rng.standard_normal((4, 16))).to(t)
    x[1, 3] = float("nan")
    w, b = (torch.from_numpy(rng.standard_normal(s)).to(t) for s in ((8, 16), (8,)))
    for act in ("none", "relu", "gelu", "silu"):
        got = opforge.torch.linear_act(x.to(DEVICE), w.to(DEVICE), b.to(DEVICE), act=act).cpu()
        assert got[1].isnan().all() and not got[[0, 2, 3]].isnan().any(), act


# The memory-bound kernels' fast paths against their edges: elementwise ops in 16-byte packs
# (common.cuh map_contiguous: lengths short of, at and past a pack, a tail, views starting one
# element in, so not 16-byte aligned) and row kernels reading a row into registers (rows.cuh:
# one warp, the most threads, rows too long for that, lengths not a whole number of packs).
PACK_LENGTHS = [1, 3, 4, 5, 31, 4097, 65536 + 3]
ROW_LENGTHS = [4, 64, 1000, 4096, 4100, 8192, 8196, 16384]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("n", PACK_LENGTHS)
def test_elementwise_packs_and_tails(n, dtype, rng):
    t = getattr(torch, dtype)
    x, y = (torch.from_numpy(rng.standard_normal(n + 1)).to(t).to(DEVICE) for _ in range(2))
    for a, b in ((x[:n], y[:n]), (x[1:], y[1:])):  # aligned, then one element in
        assert torch.equal(opforge.torch.add(a, b).cpu(), (a.cpu().float() + b.cpu().float()).to(t))
        assert torch.equal(opforge.torch.relu(a).cpu(), torch.relu(a.cpu()))
        g = opforge.torch.silu(a).cpu().double()
        rtol, atol = TOLERANCES[dtype]
        torch.testing.assert_close(g, torch.nn.functional.silu(a.cpu().double()), rtol=rtol, atol=atol)


@pytest.mark.parametrize("saved", [False, True], ids=["recomputed", "preact"])
@pytest.mark.parametrize("act", ["none", "relu", "gelu", "silu"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_linear_act_backward_libraries_and_layouts(dtype, act, saved, matmul_library, rng):
    """linear_act_backward's three results through cuBLASLt (float32 and float64) and opforge's
    own kernels, with the pre-activation saved or recomputed, against float64 autograd."""
    rtol, atol = rounded_once(dtype)
    atol += 16 * COMPUTE_EPS[dtype] * 70 ** 0.5
    for name, x, w, b in linear_layouts(rng, getattr(torch, dtype)):
        grad = torch.from_numpy(rng.standard_normal((*x.shape[:-1], w.shape[0]))).to(x.dtype).to(DEVICE)
        leaves = [t.cpu().double().requires_grad_() for t in (x, w) + ((b,) if b is not None else ())]
        z = torch.nn.functional.linear(*leaves)
        preact = torch.ops.opforge.linear_act_with_preact(x, w, b, act=act)[1] if saved else None
        if saved:
            # The kernel takes act' at the saved preact, already rounded to dtype: for relu a sign
            # that may differ from float64's where |z| is below the product's rounding (the half
            # types through cuBLASLt: opforge.testing.product_rounding), for gelu and silu a slope
            # off by act'' times that rounding, summed over the rows into the bias's gradient. The
            # reference takes act' at the same point: y = z * act'(preact) has dy/dz = act'(preact).
            y = z * slope_at(preact.cpu().double(), act)
        else:
            y = activate(z, act)
        want = torch.autograd.grad(y, leaves, grad.cpu().double())
        got = torch.ops.opforge.linear_act_backward(grad, x, w, b, preact, act=act)
        for i, (g, wnt) in enumerate(zip(got, want)):
            torch.testing.assert_close(g.cpu().double(), wnt, rtol=rtol, atol=atol * 8,
                                       msg=labelled(f"{name}: result {i}"))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("rows, n", [(1, 64), (37, 4096), (5000, 1024), (2500, 8), (3, 8192 + 8)], ids=str)
def test_norm_backward_fused_chunks(rows, n, dtype, rng):
    """The norms' backward ops where rows are read once (a block per chunk of rows, its column
    sums in registers; cuda/rows.cuh row_chunks: 256 to 2048 chunks): fewer rows than chunks (a
    row a block) and more (several), the longest rows a block takes in each dtype and one past
    (8192 + 8: the half types' three-launch path); against float64 autograd, and every output
    mask bit for bit equal to the full call."""
    t = getattr(torch, dtype)
    x, g = (torch.from_numpy(rng.standard_normal((rows, n))).to(t).to(DEVICE) for _ in range(2))
    w, b = (torch.from_numpy(rng.standard_normal(n)).to(t).to(DEVICE) for _ in range(2))
    xd, wd, bd = (v.cpu().double().requires_grad_() for v in (x, w, b))
    rtol, atol = rounded_once(dtype)
    atol += 64 * COMPUTE_EPS[dtype] * max(rows, n) ** 0.5
    cases = [("rms_norm_backward", (g, x, w), {"eps": 1e-6},
              xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + 1e-6) * wd, (xd, wd)),
             ("layer_norm_backward", (g, x, w), {"eps": 1e-5},
              torch.nn.functional.layer_norm(xd, (n,), wd, bd, 1e-5), (xd, wd, bd))]
    for name, args, attrs, y, leaves in cases:
        op = getattr(torch.ops.opforge, name)
        full = op(*args, **attrs)
        want = torch.autograd.grad(y, leaves, g.cpu().double())
        for i, (got, wnt) in enumerate(zip(full, want)):
            torch.testing.assert_close(got.cpu().double(), wnt, rtol=rtol, atol=atol,
                                       msg=labelled(f"{name}: result {i}"))
        for mask in range(1, (1 << len(full)) - 1):
            for i, (m, f) in enumerate(zip(op(*args, **attrs, output_mask=mask), full)):
                assert torch.equal(m, f) if mask >> i & 1 else m.numel() == 0, (name, mask, i)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_scatter_add_long_buckets(dtype, rng):
    """Buckets longer than the rows a thread loads ahead (8) and not a multiple of them, an empty
    one, along dim 0 and dim 1 of a strided view: the CPU's bits in float32 and float64 (the
    same order of adds), within tolerance in bfloat16."""
    t = getattr(torch, dtype)
    src = torch.from_numpy(rng.standard_normal((1000, 2 * 37))).to(t)
    index = torch.from_numpy(rng.integers(0, 3, 1000))  # bucket 3 of 4 stays empty
    for view, idx, dim in ((src[:, ::2], index, 0), (src[:74].T[::2], index[:74], 1)):
        want = opforge.torch.scatter_add(view, idx, 4, dim)
        got = opforge.torch.scatter_add(view.to(DEVICE), idx.to(DEVICE), 4, dim).cpu()
        if dtype == "bfloat16":
            torch.testing.assert_close(got, want, rtol=2.0**-7, atol=1e-2)
        else:
            assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_scatter_add_staged_buckets(dtype, rng):
    """Rows of 600: a block of 256 outputs within one bucket stages the bucket's positions in
    shared memory, 512 at a time (buckets of ~670 rows: two chunks), a block across two buckets
    walks them itself, the last block is partial: the CPU's bits in float32 and float64."""
    t = getattr(torch, dtype)
    src = torch.from_numpy(rng.standard_normal((2000, 600))).to(t)
    index = torch.from_numpy(rng.integers(0, 3, 2000))
    want = opforge.torch.scatter_add(src, index, 3, 0)
    got = opforge.torch.scatter_add(src.to(DEVICE), index.to(DEVICE), 3, 0).cpu()
    if dtype == "bfloat16":
        torch.testing.assert_close(got, want, rtol=2.0**-7, atol=1e-2)
    else:
        assert torch.equal(got, want)


def test_out_of_memory_is_reported_once():
    """A workspace the device cannot hold raises a RuntimeError naming the op; the next op is not
    blamed for it (the runtime keeps a failed call's status as its last error until someone reads
    it). scatter_add's bucket starts for 2^34 buckets take 128 GiB beside a 32 GiB float16 result
    (more than an H100's or an H200's memory; the result must not be empty, or no kernel runs)."""
    if not ON_GPU:
        pytest.skip("the CPU kernel would try to hold the buckets too")
    src = torch.zeros(3, 1, dtype=torch.float16, device=DEVICE)
    index = torch.zeros(3, dtype=torch.int64, device=DEVICE)
    with pytest.raises(RuntimeError, match=r"scatter_add\(\).*out of memory"):
        opforge.torch.scatter_add(src, index, 2**34)
    torch.cuda.empty_cache()  # the 32 GiB result went back to torch's cache: give it back
    assert torch.equal(opforge.torch.add_one(torch.ones(8, device=DEVICE)).cpu(), torch.full((8,), 2.0))


def test_workspaces_come_from_torchs_allocator(rng):
    """Under torch.ops.opforge a kernel's workspace comes from torch's caching allocator (so memory
    torch holds cached serves it), not from beside torch: rms_norm_backward's grad_weight partial
    sums are one allocation more than its two results in torch's own count, and the results match
    the CPU's."""
    if not ON_GPU:
        pytest.skip("CPU kernels need no device workspace")
    x, grad = (torch.from_numpy(rng.standard_normal((512, 1024)).astype(np.float32)) for _ in range(2))
    w = torch.from_numpy(rng.standard_normal(1024).astype(np.float32))
    want = torch.ops.opforge.rms_norm_backward(grad, x, w, 1e-6, -1)
    args = (grad.to(DEVICE), x.to(DEVICE), w.to(DEVICE))
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    got = torch.ops.opforge.rms_norm_backward(*args, 1e-6, -1)
    assert torch.cuda.memory_stats()["allocation.all.allocated"] - before >= 3
    for g, w_ in zip(got, want):
        torch.testing.assert_close(g.cpu(), w_, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_ops_wrap(dtype):
    """Integer add, mul and add_one wrap around as torch's do (two's complement), on the packed
    path (contiguous) and the strided one."""
    t = getattr(torch, dtype)
    lo, hi = torch.iinfo(t).min, torch.iinfo(t).max
    x = torch.tensor([hi, lo, hi, -3, hi, lo, 7, hi, lo], dtype=t)
    y = torch.tensor([1, -1, hi, 5, 2, lo, -9, -hi, lo], dtype=t)
    for a, b in ((x, y), (x[::2], y[::2])):
        ad, bd = a.to(DEVICE), b.to(DEVICE)
        assert torch.equal(opforge.torch.add(ad, bd).cpu(), a + b)
        assert torch.equal(opforge.torch.mul(ad, bd).cpu(), a * b)
        assert torch.equal(opforge.torch.add_one(ad).cpu(), a + 1)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_row_kernels_cached_and_in_place(n, dtype, rng):
    """Packs of 4 (float32), 2 (float64) and 8 (the half types) elements per 16 bytes."""
    t = getattr(torch, dtype)
    x = torch.from_numpy(rng.standard_normal((5, n + 1))).to(t).to(DEVICE)
    w2, b = (torch.from_numpy(rng.standard_normal(2 * n)).to(t).to(DEVICE) for _ in range(2))
    w, b = w2[:n], b[:n]
    rtol, atol = rounded_once(dtype)
    atol = max(atol, 1e-5 * (t != torch.float64))
    # rows in registers where they fit; strided rows; a strided weight (both in place); rows side
    # by side (x.T: panels of rows, the last one cut short)
    xt = torch.from_numpy(rng.standard_normal((n, 37))).to(t).to(DEVICE).T
    for v, g in ((x[:, :n].contiguous(), w), (x[:, 1:], w), (x[:, :n].contiguous(), w2[::2]), (xt, w)):
        vd, gd, bd = v.cpu().double(), g.cpu().double(), b.cpu().double()
        y = torch.softmax(vd, -1).to(t)  # the cotangent's partner in softmax_backward, in the op's dtype
        yd = y.double()
        want = {"rms_norm": vd * torch.rsqrt(vd.square().mean(-1, keepdim=True) + 1e-6) * gd,
                "layer_norm": torch.nn.functional.layer_norm(vd, (n,), gd, bd, 1e-5),
                "softmax": torch.softmax(vd, -1),
                "softmax_backward": yd * (vd - (vd * yd).sum(-1, keepdim=True))}  # v as the cotangent
        got = {"rms_norm": opforge.torch.rms_norm(v, g, 1e-6), "layer_norm": opforge.torch.layer_norm(v, g, b, 1e-5),
               "softmax": opforge.torch.softmax(v),
               "softmax_backward": torch.ops.opforge.softmax_backward(v, y.to(DEVICE))}
        for name in want:
            assert got[name].dtype == t, name
            torch.testing.assert_close(got[name].cpu().double(), want[name], rtol=rtol, atol=atol, msg=labelled(name))
