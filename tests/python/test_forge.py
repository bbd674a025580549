"""The forge device (opforge.forge, bindings/forge): a PrivateUse1 backend whose memory is its
own pool and whose work runs on its own streams. Every result is checked against the same
computation on CPU tensors; errors are checked by type and message.
"""

import gc
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import opforge  # noqa: E402

if not (Path(opforge.__file__).parent / "libopforge_forge.so").exists():
    pytest.skip("opforge was built without the forge device", allow_module_level=True)

from opforge.testing import FORGE_BESIDE_A_GPU, forge_testable  # noqa: E402

if not forge_testable():
    pytest.skip(FORGE_BESIDE_A_GPU, allow_module_level=True)

import opforge.forge as forge  # noqa: E402

from op_samples import CORE, FORWARD_OF, OPS, WITH_REFERENCE, sample  # noqa: E402


def first_dtype(name):
    dtypes = next(a for a in CORE[name].args if a["kind"].startswith("Tensor"))["dtypes"]
    return "float32" if "float32" in dtypes else dtypes[0]


def as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


# ---- the device and its module -------------------------------------------------------------

def test_module_registered():
    assert torch.forge is forge
    assert torch._C._get_privateuse1_backend_name() == "forge"
    assert forge.is_available() and forge.device_count() >= 1
    x = torch.ones(2).forge()
    assert x.is_forge and x.device == torch.device("forge", forge.current_device())


def test_set_device_and_guard():
    if forge.device_count() < 2:
        pytest.skip("needs two forge devices")
    start = forge.current_device()
    try:
        forge.set_device(1)
        assert forge.current_device() == 1
        assert torch.empty(3, device="forge").device == torch.device("forge", 1)
        with forge.device(0):
            assert forge.current_device() == 0
        assert forge.current_device() == 1
    finally:
        forge.set_device(start)


def test_invalid_device_index():
    n = forge.device_count()
    with pytest.raises(IndexError, match=f"invalid forge device index {n}"):
        torch.empty(3, device=f"forge:{n}")
    with pytest.raises(IndexError, match="invalid forge device index"):
        forge.set_device(n)
    with pytest.raises(IndexError, match="invalid forge device index"):
        torch.ones(3).to(f"forge:{n}")


def test_failed_initialisation_raises_each_time():
    code = ("import torch, opforge.forge as f\n"
            "assert not f.is_available() and f.device_count() == 0\n"
            "for _ in range(2):\n"
            "    try:\n"
            "        torch.empty(2, device='forge')\n"
            "    except RuntimeError as e:\n"
            "        assert 'OPFORGE_FORGE_DEVICES must be an integer' in str(e), e\n"
            "    else:\n"
            "        raise SystemExit('no error')\n"
            "print('ok')\n")
    env = {**os.environ, "OPFORGE_FORGE_DEVICES": "lots", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# ---- tensors, copies, printing, indexing -----------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool, torch.bfloat16])
def test_copies_both_ways(dtype, rng):
    cpu = torch.from_numpy(rng.standard_normal((7, 13)) * 100).to(dtype)
    x = cpu.to("forge")
    assert x.device.type == "forge" and x.dtype == dtype and x.shape == cpu.shape
    assert torch.equal(x.cpu(), cpu)
    assert torch.equal(cpu.T.to("forge").cpu(), cpu.T)  # non-contiguous source
    assert torch.equal(x.T.cpu(), cpu.T)  # non-contiguous forge source
    y = torch.empty_like(x)
    y.copy_(x)  # forge to forge
    assert torch.equal(y.cpu(), cpu)


def test_creation_and_to(rng):
    assert torch.equal(torch.zeros(3, 4, device="forge").cpu(), torch.zeros(3, 4))
    assert torch.equal(torch.full((5,), 2.5, device="forge").cpu(), torch.full((5,), 2.5))
    assert torch.equal(torch.arange(10, device="forge").cpu(), torch.arange(10))
    data = rng.standard_normal(6).tolist()
    assert torch.equal(torch.tensor(data, device="forge").cpu(), torch.tensor(data))
    cpu = torch.from_numpy(rng.standard_normal((4, 4)))
    x = cpu.to("forge").to(torch.float32)
    assert x.dtype == torch.float32 and torch.equal(x.to("cpu"), cpu.float())
    if forge.device_count() > 1:
        z = x.to("forge:1")
        assert z.device == torch.device("forge", 1) and torch.equal(z.cpu(), cpu.float())
    assert x[0, 0].item() == cpu[0, 0].float().item()


def test_printing(rng):
    cpu = torch.from_numpy(rng.standard_normal((3, 4))).float()
    text = repr(cpu.to("forge"))
    # torch puts the device on a line of its own when the values' line is long (scientific notation)
    assert re.search(r",\s+device='forge:0'\)$", text), text
    assert re.sub(r",\s+device='forge:0'\)$", ")", text) == repr(cpu)


def test_indexing(rng):
    cpu = torch.from_numpy(rng.standard_normal((6, 8))).float()
    x = cpu.to("forge")
    assert torch.equal(x[2].cpu(), cpu[2])
    assert torch.equal(x[:, 1:7:2].cpu(), cpu[:, 1:7:2])
    idx = torch.tensor([5, 0, 3])
    assert torch.equal(x[idx.to("forge")].cpu(), cpu[idx])
    assert torch.equal(x[x > 0].cpu(), cpu[cpu > 0])
    x[1, 2] = 7.0
    cpu[1, 2] = 7.0
    assert torch.equal(x.cpu(), cpu)


ATEN_OPS = {
    "add": lambda a, b: a + b, "mul": lambda a, b: a * b, "matmul": lambda a, b: a @ b.T,
    "sum": lambda a, b: a.sum(dim=1), "mean": lambda a, b: a.mean(), "exp": lambda a, b: a.exp(),
    "softmax": lambda a, b: torch.softmax(a, dim=-1), "max": lambda a, b: a.max(dim=0).values,
    "where": lambda a, b: torch.where(a > b, a, b), "cat": lambda a, b: torch.cat([a, b], dim=0),
    "transpose_contiguous": lambda a, b: a.t().contiguous(), "cumsum": lambda a, b: a.cumsum(1),
}


@pytest.mark.parametrize("name", list(ATEN_OPS))
def test_aten_ops_through_fallback(name, rng):
    a, b = (torch.from_numpy(rng.standard_normal((5, 9))).float() for _ in range(2))
    got = ATEN_OPS[name](a.to("forge"), b.to("forge"))
    assert got.device.type == "forge"
    torch.testing.assert_close(got.cpu(), ATEN_OPS[name](a, b))


def test_fallback_listing_and_error_mode():
    x = torch.ones(3, device="forge")
    forge.clear_fallback_ops()
    (x * 2).cpu()
    assert any(name.startswith("aten::mul") for name in forge.fallback_ops())  # mul.Tensor runs as mul.out
    forge.set_fallback("error")
    try:
        with pytest.raises(NotImplementedError, match="has no forge kernel, and falling back to the CPU is disabled"):
            x * 2
    finally:
        forge.set_fallback("allow")
    with pytest.raises(ValueError, match="mode must be 'allow' or 'error'"):
        forge.set_fallback("maybe")


# ---- opforge's own ops, natively on forge ----------------------------------------------------

NATIVE = [n for n in OPS if n in WITH_REFERENCE or n in FORWARD_OF]


@pytest.mark.parametrize("name", NATIVE)
def test_opforge_op_native(name, rng):
    import opforge.torch  # noqa: F401

    tensors, attrs = sample(name, rng, first_dtype(name))
    op = getattr(torch.ops.opforge, name)
    want = as_tuple(op(*tensors, **attrs))
    forge.clear_fallback_ops()
    with torch.inference_mode():  # the forge kernel itself, not autograd around it
        got = as_tuple(op(*[t.to("forge") for t in tensors], **attrs))
    assert not [k for k in forge.fallback_ops() if "opforge" in k], "an opforge op fell back to the CPU"
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.device.type == "forge"
        torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)


def test_opforge_function_on_forge_tensors(rng):
    """opforge.<op> hands forge tensors to the torch op (the generic DLPack path cannot read a
    PrivateUse1 device): forge in, forge out, with autograd."""
    x = torch.from_numpy(rng.standard_normal((4, 8))).float()
    w = torch.from_numpy(rng.standard_normal(8)).float()
    xf, wf = x.to("forge").requires_grad_(), w.to("forge").requires_grad_()
    got = opforge.rms_norm(xf, wf, eps=1e-6)
    assert got.device.type == "forge"
    torch.testing.assert_close(got.detach().cpu(), torch.nn.functional.rms_norm(x, (8,), w, 1e-6), rtol=1e-5, atol=1e-5)
    got.sum().backward()
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    torch.nn.functional.rms_norm(xc, (8,), wc, 1e-6).sum().backward()
    torch.testing.assert_close(wf.grad.cpu(), wc.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(xf.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NATIVE)
def test_out_variant_native(name, rng):
    """torch.ops.opforge.<op>.out on forge tensors runs forge's own kernel (no CPU fallback) into
    the given tensors, poisoned first, and gives the bits of the allocating op."""
    import opforge.torch  # noqa: F401

    tensors, attrs = sample(name, rng, first_dtype(name))
    packet = getattr(torch.ops.opforge, name)
    want = as_tuple(packet(*tensors, **attrs))
    outs = [torch.full_like(w, 77).to("forge") for w in want]
    names = [a.name for a in packet.out._schema.arguments[-len(outs):]]
    forge.clear_fallback_ops()
    assert packet.out(*[t.to("forge") for t in tensors], **attrs, **dict(zip(names, outs))) is None
    assert not [k for k in forge.fallback_ops() if "opforge" in k], "an opforge op fell back to the CPU"
    for o, w in zip(outs, want):
        assert torch.equal(o.cpu(), w)


def test_opforge_function_out_on_forge_tensors(rng):
    """opforge.<op>(..., out=) with forge tensors takes the op's out variant: written in place,
    returned as given, its version bumped; in place over an elementwise input; wrong outs are
    opforge's typed errors."""
    x = torch.from_numpy(rng.standard_normal((4, 8))).float()
    xf, out = x.to("forge"), torch.full((4, 8), float("nan")).to("forge")
    version = out._version
    assert opforge.relu(xf, out=out) is out
    assert torch.equal(out.cpu(), torch.relu(x)) and out._version == version + 1
    assert opforge.silu(xf, out=xf) is xf
    torch.testing.assert_close(xf.cpu(), torch.nn.functional.silu(x), rtol=1e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match=re.escape("relu(): 'out' is on cpu but the op runs on forge:0; every "
                                                     "tensor of an opforge op on forge must be on the same forge")):
        opforge.relu(xf, out=torch.empty(4, 8))
    with pytest.raises(ValueError, match=re.escape("relu(): 'out' must have shape [4, 8], got [4, 7]")):
        opforge.relu(xf, out=torch.empty(4, 7, device="forge"))
    with pytest.raises(TypeError, match=re.escape("relu(): 'out' must have dtype float32, got complex64")):
        opforge.relu(xf, out=torch.empty(4, 8, dtype=torch.complex64, device="forge"))
    with pytest.raises(ValueError, match=re.escape("rms_norm(): 'out' shares memory with 'x'")):
        opforge.rms_norm(xf, torch.ones(8, device="forge"), out=xf)


def test_opforge_op_mixed_devices_raises(rng):
    x = torch.from_numpy(rng.standard_normal((4, 8))).float()
    with pytest.raises(RuntimeError, match="add\\(\\): 'y' is on cpu but 'x' is on forge:0; every tensor of an "
                                           "opforge op on forge must be on the same forge device"):
        torch.ops.opforge.add(x.to("forge:0"), x)


def test_opforge_op_bad_input_raises(rng):
    x = torch.from_numpy(rng.standard_normal((4, 8))).float().to("forge")
    with pytest.raises(ValueError, match="rms_norm\\(\\): 'weight'"):
        torch.ops.opforge.rms_norm(x, torch.ones(7, device="forge"))
    with pytest.raises(TypeError, match="^add_one\\(\\): 'x' must have dtype in \\[float32, float64, float16, "
                                        "bfloat16, int32, int64\\], got complex64$"):
        torch.ops.opforge.add_one(x.to(torch.complex64))


# ---- autograd, RNG, streams, memory ----------------------------------------------------------

def train(device, steps=5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 8, generator=gen), torch.randn(32, 1, generator=gen)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def test_mlp_trains_like_cpu():
    cpu_losses, cpu_params = train("cpu")
    forge_losses, forge_params = train("forge")
    assert forge_losses[-1] < forge_losses[0]
    np.testing.assert_allclose(forge_losses, cpu_losses, rtol=1e-5)
    for f, c in zip(forge_params, cpu_params):
        torch.testing.assert_close(f, c)


def test_autograd_through_opforge_op(rng):
    x = torch.from_numpy(rng.standard_normal((4, 8))).float()
    xf = x.to("forge").requires_grad_()
    torch.ops.opforge.relu(xf).sum().backward()
    torch.testing.assert_close(xf.grad.cpu(), (x > 0).float())


def test_manual_seed_reproducible():
    torch.manual_seed(1234)
    a = torch.randn(100, device="forge").cpu()
    b = torch.rand(10, device="forge").cpu()
    torch.manual_seed(1234)
    assert torch.equal(torch.randn(100, device="forge").cpu(), a)
    assert torch.equal(torch.rand(10, device="forge").cpu(), b)
    torch.manual_seed(4321)
    assert not torch.equal(torch.randn(100, device="forge").cpu(), a)
    assert forge.initial_seed() == 4321


def test_streams_event_ordering():
    s1, s2 = forge.Stream(), forge.Stream()
    x = torch.zeros(1000, device="forge")
    with torch.inference_mode():
        with s1:
            forge._sleep(0.2)
            y = torch.ops.opforge.add_one(x)  # queued on s1 behind the pause
            done = forge.Event()
            done.record(s1)
        with s2:
            done.wait(s2)
            z = torch.ops.opforge.add_one(y)  # on s2, after the event
    forge.synchronize()
    assert torch.equal(z.cpu(), torch.full((1000,), 2.0))


def test_streams_missing_wait_is_observable():
    """The same two streams without the event: s2 copies w out while s1 is still paused, so
    the copy sees w before add_one wrote it (anything but 42.5)."""
    s1, s2 = forge.Stream(), forge.Stream()
    x = torch.full((1000,), 41.5, device="forge")
    with torch.inference_mode():
        with s1:
            forge._sleep(0.3)
            w = torch.ops.opforge.add_one(x)
        with s2:
            early = w.cpu()
    forge.synchronize()
    assert torch.equal(w.cpu(), torch.full((1000,), 42.5))
    assert not torch.equal(early, torch.full((1000,), 42.5))


def test_memory_returns_to_start():
    forge.synchronize()
    start = forge.memory_allocated()
    forge.reset_peak_memory_stats()
    for i in range(10_000):
        t = torch.empty(64 + i % 512, device="forge")
        del t
    forge.synchronize()
    assert forge.memory_allocated() == start
    held = [torch.empty(1024, device="forge") for _ in range(10)]
    assert forge.memory_allocated() >= start + 10 * 4096
    assert forge.max_memory_allocated() >= forge.memory_allocated()
    del held
    assert forge.memory_allocated() == start
    forge.empty_cache()
    assert forge.memory_reserved() >= forge.memory_allocated()



def test_event_query_synchronize_elapsed():
    start, end = forge.Event(enable_timing=True), forge.Event(enable_timing=True)
    s = forge.current_stream()
    start.record(s)
    forge._sleep(0.05)
    end.record(s)
    assert not end.query()  # the pause is still queued ahead of it
    end.synchronize()
    assert end.query()
    assert 40 <= start.elapsed_time(end) < 5000


def test_default_and_new_streams():
    default = forge.current_stream()
    assert default == forge.default_stream() and default.stream_id == 0
    s = forge.Stream()
    assert s != default and s.device == torch.device("forge", forge.current_device())
    with s:
        assert forge.current_stream() == s
    assert forge.current_stream() == default
    s.synchronize()
    assert s.query()


def test_torch_accelerator_drives_forge():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("forge")
    assert torch.accelerator.device_count() == forge.device_count()
    x = torch.ones(256, device="forge")
    # Nothing may free a forge tensor between the two reads: earlier tests' cyclic garbage (a
    # collection the first read's allocations set off) or finished tasks still holding theirs
    # (a synchronize lets them go).
    gc.collect()
    forge.synchronize()
    assert torch.accelerator.memory_allocated() == forge.memory_allocated() >= x.numel() * 4
    s = torch.Stream(device="forge")
    torch.accelerator.set_stream(s)
    try:
        assert torch.accelerator.current_stream() == s
    finally:
        torch.accelerator.set_stream(forge.default_stream())
    torch.accelerator.synchronize()
    del x


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="beside CUDA, torch pins host memory with CUDA's allocator whatever the accelerator "
                           "(GetCPUAllocatorMaybePinned in ATen/EmptyTensor.cpp, pytorch#14560): forge's "
                           "is_pinned does not know those blocks (seen on the H100)")
def test_pinned_host_memory():
    t = torch.empty(16, pin_memory=True)
    assert t.is_pinned()
    assert not torch.empty(16).is_pinned()
    assert torch.ones(8).pin_memory().is_pinned()


def test_save_and_load(tmp_path, rng):
    cpu = torch.from_numpy(rng.standard_normal((3, 5))).float()
    path = tmp_path / "t.pt"
    torch.save({"w": cpu.to("forge")}, path)
    loaded = torch.load(path)
    assert loaded["w"].device.type == "forge"
    assert torch.equal(loaded["w"].cpu(), cpu)
    assert torch.equal(torch.load(path, map_location="cpu")["w"], cpu)


def test_rng_state_round_trip():
    state = forge.get_rng_state()
    a = torch.randn(20, device="forge").cpu()
    forge.set_rng_state(state)
    assert torch.equal(torch.randn(20, device="forge").cpu(), a)


def test_generator_object(rng):
    g = torch.Generator(device="forge").manual_seed(7)
    a = torch.randn(50, device="forge", generator=g).cpu()
    g.manual_seed(7)
    assert torch.equal(torch.randn(50, device="forge", generator=g).cpu(), a)


def test_host_dereference_fails_loudly():
    """Reading a forge tensor's memory from the host (a bug) kills the process with a message
    rather than returning garbage. In a child process: the test process must not crash."""
    if not forge.memory_protected():
        pytest.skip("OPFORGE_FORGE_PROTECT=0")
    code = ("import ctypes, torch, opforge.forge\n"
            "x = torch.ones(1024, device='forge')\n"
            "print(ctypes.c_float.from_address(x.data_ptr()).value)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and out.stdout == ""
    assert "the host touched forge device memory" in out.stderr


# Work queued on forge streams and never synchronized, then exit (a child process each time).
EXIT_WITH_WORK_QUEUED = """
import torch, opforge.forge
x = torch.randn(256, 4096, device="forge")
w = torch.ones(4096, device="forge")
ys = [torch.ops.opforge.rms_norm(x, w, 1e-6) for _ in range(4)]
with torch.forge.stream(torch.forge.Stream()):
    z = torch.ops.opforge.gelu(x)
print("queued")
"""


def test_exit_with_work_still_queued_is_clean():
    """Python's exit waits for the queued work: a stream worker that dropped a finished task's
    tensors during finalization would take the GIL and be ended inside the destructor, aborting
    the process (it did, in 5 to 10 runs of 10, before the exit drain)."""
    for _ in range(5):
        out = subprocess.run([sys.executable, "-c", EXIT_WITH_WORK_QUEUED], capture_output=True, text=True,
                             timeout=120)
        assert (out.returncode, out.stdout.strip()) == (0, "queued"), out.stderr[-2000:]
        assert "terminate" not in out.stderr


# A backward on forge under torch.utils.checkpoint, then exit: torch's autograd thread for the
# device drops its last graph task (which holds Python state) as the interpreter finalizes.
EXIT_AFTER_CHECKPOINTED_BACKWARD = """
import torch, opforge.torch as ot, opforge.forge
from torch.utils.checkpoint import checkpoint
w = torch.randn(16, 8, device="forge", requires_grad=True)
x = torch.randn(4, 8, device="forge", requires_grad=True)
f = lambda x: ot.rms_norm(ot.linear_act(x, w, None, act="gelu"), torch.ones(16, device="forge")).square().sum()
checkpoint(f, x, use_reentrant=True).backward()
xx = torch.randn(100, device="forge", requires_grad=True)
checkpoint(lambda t: (torch.nn.functional.dropout(t, 0.5, training=True) * t).sum(), xx, use_reentrant=False).backward()
try:
    with torch.autocast("forge", dtype=torch.float32):  # unsupported: a warning, autocast off
        torch.randn(4, 8, device="forge")
except Exception as error:
    print(error)
print("done")
"""


def test_exit_after_a_checkpointed_backward_is_clean():
    """Before forge settled torch's autograd threads at exit (pytorch/pytorch#38228), this aborted
    ("terminate called without an active exception") in about 3 runs of 16. The 8 runs overlap
    (each is mostly importing torch), two at a time."""
    runs = [[sys.executable, "-c", EXIT_AFTER_CHECKPOINTED_BACKWARD]] * 8
    for pair in (runs[i:i + 2] for i in range(0, len(runs), 2)):
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for cmd in pair]
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=120)
            assert (proc.returncode, stdout.strip()) == (0, "done"), stdout[-2000:] + stderr[-2000:]


def test_torch_utils_checkpoint_with_forge_loaded(rng):
    """checkpoint() enters torch.autocast for the current accelerator (forge) on every
    recomputation, CPU tensors included: forge must answer get_amp_supported_dtype."""
    from torch.utils.checkpoint import checkpoint

    w = torch.from_numpy(rng.standard_normal((6, 5)))
    for device in ("cpu", "forge"):
        x = torch.from_numpy(rng.standard_normal((3, 5))).to(device).detach().requires_grad_()
        wd = w.to(device).detach().requires_grad_()
        f = lambda x: torch.ops.opforge.linear_act(x, wd, None, "gelu").square().sum()  # noqa: E731
        want = torch.autograd.grad(f(x), [x, wd])
        for reentrant in (False, True):  # the reentrant form works with .backward() only
            checkpoint(f, x, use_reentrant=reentrant).backward()
            for a, b in zip((x.grad, wd.grad), want):
                torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-12, atol=1e-12)
            x.grad = wd.grad = None
    assert torch.float16 in torch.forge.get_amp_supported_dtype() and torch.forge.is_bf16_supported()


def autoload_env(**extra):
    """The environment for a fresh `import torch` that autoloads forge: beside a GPU (the GPU
    machine's forge run) autoload is off unless forced, so these tests force it there."""
    from opforge_autoload import gpu_in_use_by_torch

    return {**os.environ, "OPFORGE_FORGE_AUTOLOAD": "1" if gpu_in_use_by_torch() else "", **extra}


def test_import_torch_autoloads_forge():
    code = "import torch\nprint(torch.ones(2, device='forge').is_forge, hasattr(torch, 'forge'))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=autoload_env())
    assert out.returncode == 0 and out.stdout.split() == ["True", "True"], out.stderr[-2000:]


@pytest.mark.parametrize("setting", ["", "1"])
def test_no_autoload_beside_a_gpu(setting):
    """Beside a GPU (simulated: the check says so) torch would take forge for its accelerator and
    fail CUDA backward passes, so import torch leaves forge out unless OPFORGE_FORGE_AUTOLOAD=1;
    an explicit import still loads it, with a warning naming the consequence."""
    code = ("import opforge_autoload, warnings\n"
            "opforge_autoload.gpu_in_use_by_torch = lambda: True\n"
            "import torch\nprint(hasattr(torch, 'forge'))\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    import opforge.forge\n"
            "print(any('pytorch/pytorch#161129' in str(w.message) for w in caught), torch.ones(1, device='forge').is_forge)\n")
    env = {**os.environ, "OPFORGE_FORGE_AUTOLOAD": setting}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    autoloaded = setting == "1"
    # When autoloaded, the warning came at import torch (not caught here); the explicit import is a no-op.
    assert out.returncode == 0 and out.stdout.split() == [str(autoloaded), str(not autoloaded), "True"], out.stderr[-2000:]


def test_gpu_check_on_this_machine():
    from opforge_autoload import gpu_in_use_by_torch

    expected = bool(torch.version.cuda and torch.cuda.device_count() > 0 or getattr(torch.version, "hip", None))
    assert gpu_in_use_by_torch() == expected


def test_broken_opforge_does_not_break_import_torch(tmp_path):
    # An opforge package that raises on import, found first on the path: torch still imports,
    # with a warning naming the cause, and without the device.
    (tmp_path / "opforge").mkdir()
    (tmp_path / "opforge" / "__init__.py").write_text("raise ImportError('opforge is broken here')\n")
    (tmp_path / "opforge" / "libopforge_forge.version").write_text(torch.__version__)
    code = "import torch\nprint(hasattr(torch, 'forge'))\n"
    env = autoload_env(PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0 and out.stdout.split() == ["False"], out.stderr[-2000:]
    assert "the forge device was not enabled (ImportError: opforge is broken here)" in out.stderr


def test_built_for_other_torch_is_an_import_error(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "1.0.0")
    with pytest.raises(ImportError, match="built for torch .* and this is torch 1.0.0"):
        forge._check_build()


def test_async_error_surfaces_at_synchronize():
    """Validation happens at the call, so bad input never reaches a stream; a failure inside a
    queued task is kept and raised by the next synchronize of that stream."""
    with pytest.raises(IndexError, match="invalid forge device index"):
        forge.synchronize(forge.device_count())


def test_compile_with_aot_eager(rng):
    """torch.compile on forge tensors: the aot_eager backend runs the graph's ops on forge,
    forward and backward, as eager mode does."""
    x = torch.from_numpy(rng.standard_normal((4, 8))).to("forge").requires_grad_()
    w = torch.from_numpy(rng.random(8)).to("forge").requires_grad_()
    f = torch.compile(lambda x, w: torch.ops.opforge.rms_norm(x, w, 1e-6).sin(), fullgraph=True, backend="aot_eager")
    y = f(x, w)
    y.sum().backward()
    xc, wc = (t.detach().cpu().requires_grad_() for t in (x, w))
    yc = torch.ops.opforge.rms_norm(xc, wc, 1e-6).sin()
    yc.sum().backward()
    assert y.device.type == "forge" and x.grad.device.type == "forge"
    for got, want in ((y, yc), (x.grad, xc.grad), (w.grad, wc.grad)):
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-12, atol=1e-12)


def test_inductor_on_forge_ends_instead_of_hanging():
    """Inductor creates forge tensors and drops them while their copies were still queued, then
    copies with the GIL held: a stream worker that freed those tensors (their Python objects need
    the GIL) deadlocked it. Finished tasks are now freed by the threads that call in."""
    code = """
import torch, opforge.forge
x, w = torch.randn(4, 8, device="forge"), torch.ones(8, device="forge")
try:
    torch.compile(lambda x, w: torch.ops.opforge.rms_norm(x, w, 1e-6), fullgraph=True)(x, w)
except Exception as e:
    print(type(e).__name__)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_an_error_on_a_side_stream_is_the_devices():
    """As CUDA's errors are the context's: a task failing on one stream is raised by the next
    synchronization with the device (here the event the default stream waits on), once."""
    src, bad = torch.randn(3, 4, device="forge"), torch.tensor([0, 1, 7], device="forge")
    side = torch.forge.Stream()
    with torch.forge.stream(side):
        out = torch.ops.opforge.scatter_add(src, bad, 2, 0)
    done = torch.forge.Event()
    done.record(side)
    failed = r"forge:0 stream \d+: an asynchronous task failed: scatter_add\(\): 'index'"
    with pytest.raises(RuntimeError, match=failed):
        done.synchronize()
    torch.forge.current_stream().wait_event(done)
    assert out.shape == (2, 4)
    torch.forge.synchronize()  # reported once: the device is usable again
    assert torch.equal(torch.ops.opforge.add_one(torch.ones(2, device="forge")).cpu(), torch.full((2,), 2.0))
    with torch.forge.stream(side):
        torch.ops.opforge.scatter_add(src, bad, 2, 0)
    done.record(side)
    torch.forge.current_stream().wait_event(done)  # the default stream now runs after the failure
    with pytest.raises(RuntimeError, match=failed):
        torch.ones(1, device="forge").cpu()  # a blocking copy on the default stream


def test_elementwise_results_keep_the_layout():
    """An elementwise op on a permuted forge tensor: a result with torch's strides for it."""
    x = torch.randn(3, 4, 5, dtype=torch.float64).permute(2, 0, 1)
    got = torch.ops.opforge.relu(x.to("forge"))
    assert got.device.type == "forge" and got.stride() == torch.relu(x).stride() != (12, 4, 1)
    torch.testing.assert_close(got.cpu(), torch.relu(x))
