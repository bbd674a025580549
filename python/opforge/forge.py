"""torch.forge: the forge device, an out-of-tree PyTorch backend on PrivateUse1 built on opforge.

A forge device is memory of its own (a caching pool of mapped blocks that host code cannot read:
the pages are inaccessible except while forge's own kernels and copies run) and streams of its
own (each a queue drained by a worker thread), executing opforge's CPU kernels. Every opforge op
(torch.ops.opforge.*) runs natively on forge, asynchronously on the current forge stream; any
other aten op falls back to the CPU (fallback_ops() lists which did; set_fallback("error") makes
that an error). Several virtual devices: OPFORGE_FORGE_DEVICES (default 2).

``import torch`` loads it through the ``torch.backends`` entry point (TORCH_DEVICE_BACKEND_AUTOLOAD=0
turns that off), except beside a GPU torch can use: torch then takes forge for its accelerator
and CUDA backward passes fail (pytorch/pytorch#161129; opforge_autoload says more);
``import opforge.forge`` loads it explicitly (with a warning beside a GPU). The C++ part
(libopforge_forge.so, bindings/forge) uses torch's full C++ API, so it loads only on the torch
it was built against; any other raises ImportError here.

    x = torch.randn(4, 8, device="forge")
    y = torch.ops.opforge.rms_norm(x, torch.ones(8, device="forge"))   # queued on the stream
    y.cpu()                                                          # waits, copies back
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import sys
from pathlib import Path

import torch

_LIBRARY = Path(__file__).with_name("libopforge_forge.so")
_ERRORS = {"IndexError": IndexError, "TypeError": TypeError, "ValueError": ValueError}


def _check_build() -> None:
    version_file = _LIBRARY.with_suffix(".version")
    if not _LIBRARY.exists() or not version_file.exists():
        raise ImportError("opforge.forge: this opforge was built without the forge device (it needs torch at build "
                          "time); install torch and rebuild opforge (pip install --no-build-isolation .)")
    built = version_file.read_text().strip()
    if built != torch.__version__:
        raise ImportError(f"opforge.forge: the forge device was built for torch {built} and this is torch "
                          f"{torch.__version__}; it uses torch's C++ API, which changes between versions: rebuild "
                          "opforge against this torch (pip install --no-build-isolation .)")


def _load_library() -> ctypes.CDLL:
    _check_build()
    import opforge.torch  # noqa: F401  (defines torch.ops.opforge.*; forge adds their PrivateUse1 kernels)

    torch.ops.load_library(str(_LIBRARY))
    lib = ctypes.CDLL(str(_LIBRARY))
    c_char_p, c_int, c_int64 = ctypes.c_char_p, ctypes.c_int, ctypes.c_int64
    for name, args, res in [
        ("forge_last_error", [], c_char_p), ("forge_registration_errors", [], c_char_p),
        ("forge_register_new_ops", [], c_char_p),
        ("forge_torch_version", [], c_char_p), ("forge_device_count", [], c_int), ("forge_init_error", [], c_char_p),
        ("forge_init", [], c_int), ("forge_current_device", [], c_int), ("forge_set_device", [c_int64], c_int),
        ("forge_synchronize", [c_int64], c_int), ("forge_memory_stat", [c_int64, c_int], c_int64),
        ("forge_reset_peak", [c_int64], c_int), ("forge_empty_cache", [], None), ("forge_set_caching", [c_int], None),
        ("forge_caching", [], c_int), ("forge_protection", [], c_int), ("forge_set_fallback_mode", [c_int], None),
        ("forge_fallback_mode", [], c_int), ("forge_clear_fallback_ops", [], None), ("forge_fallback_ops", [], c_char_p),
        ("forge_manual_seed", [c_int64, ctypes.c_uint64], c_int), ("forge_seed", [c_int64], c_int),
        ("forge_initial_seed", [c_int64, ctypes.POINTER(ctypes.c_uint64)], c_int),
        ("forge_sleep", [ctypes.c_double], c_int), ("forge_current_stream_id", [c_int64], c_int64),
        ("forge_set_stream", [c_int64, c_int64], c_int), ("forge_device_type", [], c_int),
        ("forge_rng_state", [c_int64, ctypes.c_void_p, c_int64], c_int64),
        ("forge_set_rng_state", [c_int64, ctypes.c_void_p, c_int64], c_int),
    ]:
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    if lib.forge_torch_version().decode() != torch.__version__:  # the .version file was swapped or stale
        raise ImportError(f"opforge.forge: libopforge_forge.so was built for torch {lib.forge_torch_version().decode()}, "
                          f"this is torch {torch.__version__}; rebuild opforge")
    if lib.forge_registration_errors():
        raise ImportError("opforge.forge: " + lib.forge_registration_errors().decode())
    return lib


def _register_backend() -> None:
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", "forge"):
        raise ImportError(f"opforge.forge: PrivateUse1 is already taken by the '{name}' backend; torch allows one")
    if name == "privateuseone":
        torch.utils.rename_privateuse1_backend("forge")
    if not hasattr(torch, "forge"):
        torch._register_device_module("forge", sys.modules[__name__])
    if not hasattr(torch.Tensor, "is_forge"):
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)


# ---- errors ----------------------------------------------------------------------------------

def _check(status: int):
    """Raises the C side's last error (c10's type name leads it when it is not RuntimeError)."""
    if status < 0:
        message = _lib.forge_last_error().decode()
        raise _ERRORS.get(message.split(":", 1)[0], RuntimeError)(message)
    return status


def _index(device, optional: bool = True) -> int:
    """A device index from an int, "forge", "forge:1" or a torch.device; current device if None."""
    if device is None:
        if not optional:
            raise ValueError("forge: a device is required")
        return current_device()
    if isinstance(device, int):
        index = device
    else:
        d = torch.device(device)
        if d.type != "forge":
            raise ValueError(f"forge: expected a forge device, got {d}")
        index = current_device() if d.index is None else d.index
    if not 0 <= index < device_count():
        raise IndexError(f"forge: invalid forge device index {index} (there are {device_count()} forge devices, set by "
                         "OPFORGE_FORGE_DEVICES)")
    return index


# ---- device ----------------------------------------------------------------------------------

_initialized = False


def is_available() -> bool:
    """True when at least one forge device can be used. Never raises."""
    return _lib.forge_device_count() > 0


def device_count() -> int:
    """The number of forge devices (OPFORGE_FORGE_DEVICES); 0 when that setting is invalid. Never raises."""
    return _lib.forge_device_count()


def is_initialized() -> bool:
    return _initialized


def _lazy_init() -> None:
    """Checks the device configuration once it is first used; a failure raises RuntimeError here and
    at every later use, with the reason (forge has nothing else to set up: its pool and streams
    start on demand)."""
    global _initialized
    if _initialized:
        return
    _check(_lib.forge_init())
    _initialized = True


init = _lazy_init


def current_device() -> int:
    _lazy_init()
    return _check(_lib.forge_current_device())


def set_device(device) -> None:
    _lazy_init()
    _check(_lib.forge_set_device(_index(device)))


class device:
    """Context manager selecting a forge device: ``with torch.forge.device(1): ...``."""

    def __init__(self, device):
        self.index = _index(device)
        self.previous = -1

    def __enter__(self):
        self.previous = current_device()
        set_device(self.index)

    def __exit__(self, *exc):
        set_device(self.previous)
        return False


def synchronize(device=None) -> None:
    """Waits for all work queued on every stream of `device`; raises if a queued task failed."""
    _lazy_init()
    _check(_lib.forge_synchronize(_index(device)))


# ---- streams and events ------------------------------------------------------------------------

class Stream(torch.Stream):
    """A forge stream: a FIFO of work run by its own thread. ``with stream:`` makes it current."""

    def __new__(cls, device=None, priority: int = 0):
        _lazy_init()
        return super().__new__(cls, device=torch.device("forge", _index(device)), priority=priority)


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:
    """A forge event (a torch.Event; torch compares events by exact type, so this is a factory, not
    a subclass): record() on a stream, wait() to make another stream wait for it, query(),
    synchronize(), elapsed_time() in milliseconds (forge always takes the time)."""
    _lazy_init()
    return torch.Event(device="forge", enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)


def current_stream(device=None) -> torch.Stream:
    """The calling thread's current stream on `device` (its default stream unless changed)."""
    _lazy_init()
    index = _index(device)
    return torch.Stream(stream_id=_check(_lib.forge_current_stream_id(index)), device_index=index,
                        device_type=_lib.forge_device_type())


def default_stream(device=None) -> torch.Stream:
    _lazy_init()
    return torch.Stream(stream_id=0, device_index=_index(device), device_type=_lib.forge_device_type())


def set_stream(stream: torch.Stream) -> None:
    _lazy_init()
    _check(_lib.forge_set_stream(stream.device_index, stream.stream_id))


@contextlib.contextmanager
def stream(s: torch.Stream | None):
    """Makes `s` the current stream for the block (None: no change)."""
    if s is None:
        yield
        return
    with s:
        yield


def _sleep(seconds: float, device=None) -> None:
    """Queues a pause of `seconds` on the current stream of `device`: a deliberately slow task,
    for tests and benchmarks of stream ordering."""
    with globals()["device"](_index(device)):
        _check(_lib.forge_sleep(float(seconds)))


# ---- memory ------------------------------------------------------------------------------------

def _stat(device, which: int) -> int:
    _lazy_init()
    return _check(_lib.forge_memory_stat(_index(device), which))


def memory_allocated(device=None) -> int:
    """Bytes held by live forge tensors on `device` (blocks are whole pages)."""
    return _stat(device, 0)


def memory_reserved(device=None) -> int:
    """Bytes mapped by the pool on `device`: in use plus cached for reuse."""
    return _stat(device, 1)


def max_memory_allocated(device=None) -> int:
    return _stat(device, 2)


def max_memory_reserved(device=None) -> int:
    return _stat(device, 3)


def memory_stats(device=None) -> dict:
    names = ["allocated_bytes", "reserved_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "requested_bytes",
             "allocations", "segments"]
    return {name: _stat(device, i) for i, name in enumerate(names)}


def reset_peak_memory_stats(device=None) -> None:
    _lazy_init()
    _check(_lib.forge_reset_peak(_index(device)))


def empty_cache() -> None:
    """Unmaps every cached block (memory_reserved() drops to memory_allocated())."""
    _lib.forge_empty_cache()


def set_caching(enabled: bool) -> None:
    """False: every allocation maps fresh pages and every free unmaps them (no pool)."""
    _lib.forge_set_caching(int(bool(enabled)))


def caching() -> bool:
    return bool(_lib.forge_caching())


def memory_protected() -> bool:
    """Whether forge memory is unreadable from the host outside forge's own kernels
    (OPFORGE_FORGE_PROTECT=0 turns that off)."""
    return bool(_lib.forge_protection())


# ---- CPU fallback ------------------------------------------------------------------------------

def fallback_ops() -> dict[str, int]:
    """aten ops (with overload) that ran on the CPU because forge has no kernel for them, with
    how often, since the start or the last clear_fallback_ops()."""
    lines = _lib.forge_fallback_ops().decode().splitlines()
    return {name: int(count) for name, count in (line.rsplit(" ", 1) for line in lines)}


def clear_fallback_ops() -> None:
    _lib.forge_clear_fallback_ops()


def set_fallback(mode: str) -> None:
    """"allow" (default): ops without a forge kernel run on the CPU. "error": they raise
    NotImplementedError naming the op."""
    if mode not in ("allow", "error"):
        raise ValueError(f"forge.set_fallback(): mode must be 'allow' or 'error', got {mode!r}")
    _lib.forge_set_fallback_mode(int(mode == "error"))


def get_fallback() -> str:
    return "error" if _lib.forge_fallback_mode() else "allow"


@contextlib.contextmanager
def no_fallback():
    """Within the block, an op that would fall back to the CPU raises instead."""
    previous = get_fallback()
    set_fallback("error")
    try:
        yield
    finally:
        set_fallback(previous)


# ---- mixed precision ---------------------------------------------------------------------------

def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes torch.autocast("forge", dtype=...) accepts. torch asks for it whenever autocast
    names this device, and torch.utils.checkpoint does so on every recomputation when forge is
    the current accelerator, for CPU tensors too."""
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Every forge device computes bfloat16 (its kernels are opforge's CPU kernels)."""
    return True


# ---- random numbers ----------------------------------------------------------------------------

def _is_in_bad_fork() -> bool:
    return False


def manual_seed(seed: int) -> None:
    """Seeds the current device's default generator."""
    if is_available():
        _check(_lib.forge_manual_seed(current_device(), int(seed) & 0xFFFF_FFFF_FFFF_FFFF))


def manual_seed_all(seed: int) -> None:
    """Seeds every forge device; torch.manual_seed calls it. Quietly does nothing when no forge
    device is usable, so torch.manual_seed never fails because of forge."""
    if is_available():
        for i in range(device_count()):
            _check(_lib.forge_manual_seed(i, int(seed) & 0xFFFF_FFFF_FFFF_FFFF))


def seed() -> None:
    _check(_lib.forge_seed(current_device()))


def seed_all() -> None:
    for i in range(device_count()):
        _check(_lib.forge_seed(i))


def get_rng_state(device=None) -> torch.Tensor:
    """The default generator's state of `device`, as a CPU uint8 tensor (torch.testing saves and
    restores it around checks, as for any accelerator)."""
    index = _index(device)
    state = torch.empty(_check(_lib.forge_rng_state(index, None, 0)), dtype=torch.uint8)
    _check(_lib.forge_rng_state(index, state.data_ptr(), state.numel()))
    return state


def set_rng_state(state: torch.Tensor, device=None) -> None:
    state = state.detach().to("cpu", torch.uint8).contiguous()
    _check(_lib.forge_set_rng_state(_index(device), state.data_ptr(), state.numel()))


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states) -> None:
    for i, state in enumerate(states):
        set_rng_state(state, i)


def initial_seed() -> int:
    out = ctypes.c_uint64()
    _check(_lib.forge_initial_seed(current_device(), ctypes.byref(out)))
    return out.value


# ---- loading -----------------------------------------------------------------------------------

def _drain_at_exit() -> None:
    """Waits, as Python exits, for the work queued on every forge stream, and frees the finished
    tasks' tensors. Dropping the last reference to a tensor that has a Python object takes the
    GIL: a thread asking for it while the interpreter finalizes is ended inside that destructor,
    and the process aborts ("terminate called without an active exception"). Like an
    asynchronous device error nobody synchronized on, a failed task is reported on stderr, not
    raised."""
    for device in range(_lib.forge_device_count()):
        if _lib.forge_synchronize(device) < 0:  # ctypes releases the GIL: the worker can finish
            print(f"opforge.forge: at exit: {_lib.forge_last_error().decode()}", file=sys.stderr)
    _settle_autograd_threads()


def _settle_autograd_threads() -> None:
    """torch's autograd runs a forge backward on a thread of its own (one per device, as for
    CUDA), which may drop its reference to a finished graph task after the caller has been
    woken. The task holds Python state (torch.autograd.backward stashes a contextvars context in
    it; checkpoint's hooks), so when the program exits right after a backward, that drop needs
    the GIL while the interpreter finalizes and the process aborts ("terminate called without an
    active exception", pytorch/pytorch#38228). One more backward per device, run straight on the
    engine so that it captures no Python object, lets each thread finish the last one first
    (waiting for it releases the GIL) and leaves it holding nothing that needs Python."""
    if not is_initialized():
        return
    engine = torch.autograd.Variable._execution_engine
    try:
        for index in range(device_count()):
            leaf = torch.zeros((), device=torch.device("forge", index), requires_grad=True)
            engine.run_backward((leaf,), (torch.ones_like(leaf),), False, False, (), True, True)
    except Exception as error:  # noqa: BLE001  (never fail an exit over this)
        print(f"opforge.forge: at exit: {error}", file=sys.stderr)


def _add_ops(names: list[str]) -> None:
    """Forge kernels for ops a plugin added after this module loaded (opforge.load_plugin)."""
    errors = _lib.forge_register_new_ops()
    if errors:
        raise RuntimeError("opforge.forge: " + errors.decode())


def _warn_beside_a_gpu() -> None:
    from opforge_autoload import gpu_in_use_by_torch

    if gpu_in_use_by_torch():
        import warnings

        warnings.warn("opforge.forge: torch takes the forge device (PrivateUse1) for its accelerator from now on, so "
                      "backward passes over CUDA tensors fail in this process (torch's autograd engine: "
                      "'opt_ready_stream && opt_parent_stream INTERNAL ASSERT FAILED', pytorch/pytorch#161129); "
                      "use forge in a process of its own", RuntimeWarning, stacklevel=3)


_lib = _load_library()
_warn_beside_a_gpu()
_register_backend()
atexit.register(_drain_at_exit)
