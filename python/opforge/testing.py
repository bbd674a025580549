"""Test helpers for op tests, opforge's own and a kernel author's (an op built as a plugin or
outside a checkout): float64 NumPy data into any framework and dtype and back, per-dtype
tolerances, non-contiguous views, an op's reference module, which opforge ops a torch call
really ran (torch_ops_dispatched), and the pytest fixtures `rng`
(fresh seed per test, replayed by OPFORGE_TEST_SEED=<seed>) and `simd_target` (the test once
per SIMD target the CPU runs). Import the fixtures into a test module to use them there:
`from opforge.testing import rng, simd_target`. Needs pytest and NumPy; torch and jax cases
skip where those are not installed. Importing it turns on jax's 64-bit mode when jax is
installed (float64 and int64 arrays would be 32-bit otherwise).

Tests draw float64 data, convert it to the dtype under test, and compute their reference
in float64 from the values the op actually saw (to_float64 of the converted input), so the
only error left to tolerate is the op's own arithmetic and final rounding.
"""

import importlib
import importlib.util
import os
import secrets
from pathlib import Path

import numpy as np
import pytest

import opforge

try:  # a NumPy-only install tests its ops too (the torch cases skip)
    import torch
except ImportError:
    torch = None

try:
    import jax
except ImportError:
    jax = None
else:
    # Set at import, before any test runs, so test order cannot change which dtypes jax tests see.
    jax.config.update("jax_enable_x64", True)

FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
INT_DTYPES = ("int32", "int64")
FRAMEWORKS = ("numpy", "torch", "jax")

# (rtol, atol). Half types are computed in float32 and rounded once, so their error is about
# half an ulp of the result: 2^-11 for float16, 2^-8 for bfloat16.
TOLERANCES = {
    "float64": (1e-12, 1e-12),
    "float32": (1e-5, 1e-6),
    "float16": (1e-3, 1e-4),
    "bfloat16": (1e-2, 1e-3),
}
# Relative precision the kernels compute in: float32 for the half types.
COMPUTE_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-24, "bfloat16": 2.0**-24}


def has_dtype(framework, dtype):
    return not (framework == "numpy" and dtype == "bfloat16")


def installed(framework) -> bool:
    return framework == "numpy" or {"torch": torch, "jax": jax}[framework] is not None


def cases(frameworks, dtypes):
    """(framework, dtype) pairs the framework can hold, as pytest params with readable ids;
    those of a framework not installed are skipped."""
    return [pytest.param(f, d, id=f"{f}-{d}",
                         marks=() if installed(f) else pytest.mark.skip(reason=f"{f} is not installed"))
            for f in frameworks for d in dtypes if has_dtype(f, d)]


def random(rng, shape, dtype):
    """Float64 data suited to `dtype`: standard normal, or integers small enough to add exactly."""
    if dtype in INT_DTYPES:
        return rng.integers(-(1 << 20), 1 << 20, size=shape).astype(np.float64)
    return rng.standard_normal(shape)


def to_framework(a, framework, dtype):
    """Float64 NumPy array -> `framework` array of `dtype` (rounded to nearest)."""
    a = np.asarray(a, dtype=np.float64)
    if framework in FRAMEWORKS and not installed(framework):
        pytest.skip(f"{framework} is not installed")
    if framework == "numpy":
        assert dtype != "bfloat16", "NumPy has no bfloat16; use torch or jax"
        return a.astype(dtype)
    if framework == "torch":
        return torch.from_numpy(a).to(getattr(torch, dtype))
    if framework == "jax":
        import jax.numpy as jnp

        # Enabled above; without it jax would quietly hand back 32-bit arrays.
        assert jax.config.jax_enable_x64 or dtype not in ("float64", "int64"), "jax_enable_x64 is off"
        return jnp.asarray(a).astype(getattr(jnp, dtype))
    raise ValueError(f"unknown framework {framework!r}")


def is_torch_tensor(x) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def framework_of(x):
    if isinstance(x, np.ndarray):
        return "numpy"
    if is_torch_tensor(x):
        return "torch"
    if jax is not None and isinstance(x, jax.Array):
        return "jax"
    raise TypeError(f"not an array: {type(x).__name__}")


def on_gpu(x) -> bool:
    """Whether x (a NumPy, torch or JAX array) lives on a GPU: JAX puts its arrays there by default."""
    if is_torch_tensor(x):
        return x.device.type == "cuda"
    devices = getattr(x, "devices", None)
    return devices is not None and any(d.platform == "gpu" for d in devices())


# Largest relative error of one rounding to the half types (their unit roundoff).
HALF_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8}


def product_rounding(got, product, dtype):
    """The error linear_act's GPU path may add for the half types: cuBLASLt's bias epilogue adds
    the bias to the product already rounded to the dtype (seen with cuBLASLt 13.1 on the H200; torch's
    F.linear takes the same path), one rounding of |x @ w^T| more than the CPU's. 0 elsewhere."""
    if dtype not in HALF_ROUNDOFF or not on_gpu(got):
        return 0.0
    return HALF_ROUNDOFF[dtype] * np.abs(product)


def dtype_of(x):
    if is_torch_tensor(x):
        return str(x.dtype).removeprefix("torch.")
    return np.dtype(x.dtype).name  # NumPy, and jax (ml_dtypes names its bfloat16 'bfloat16')


def to_float64(x):
    """Any framework's array -> float64 NumPy array (a copy)."""
    if is_torch_tensor(x):
        return x.detach().cpu().to(torch.float64).numpy()
    return np.asarray(x).astype(np.float64)


def assert_result(got, framework, dtype, shape):
    """The op returned the caller's kind of array, with the expected dtype and shape."""
    assert framework_of(got) == framework, f"{framework} in, {type(got).__name__} out"
    assert dtype_of(got) == dtype
    assert tuple(got.shape) == tuple(shape)


def assert_close(got, want, dtype):
    """`got` (any framework) matches the float64 reference `want` within `dtype`'s tolerance.
    NaN must meet NaN and inf must meet the same inf; integers must match exactly."""
    assert dtype_of(got) == dtype
    g = to_float64(got)
    assert g.shape == np.shape(want)
    if dtype in INT_DTYPES:
        np.testing.assert_array_equal(g, want)
    else:
        rtol, atol = TOLERANCES[dtype]
        np.testing.assert_allclose(g, want, rtol=rtol, atol=atol, equal_nan=True)


def assert_close_scaled(got, want, scale, dtype):
    """Like assert_close, plus 16 ulps (of the compute type) of `scale`, the magnitude of the
    terms a result was summed from: for results that are sums that cancel (gradients of
    normalizations), whose error follows the terms, not the result. NaN must meet NaN."""
    rtol, atol = TOLERANCES[dtype]
    allowed = atol + 16 * COMPUTE_EPS[dtype] * scale + rtol * np.abs(want)
    g = to_float64(got)
    assert g.shape == want.shape
    bad = ~((np.abs(g - want) <= allowed) | (np.isnan(g) & np.isnan(want)))
    assert not bad.any(), f"{bad.sum()} of {bad.size} off: got {g[bad][:5]}, want {want[bad][:5]}"


STRIDED_KINDS = {
    "numpy": ("transposed", "step", "reversed", "broadcast"),
    "torch": ("transposed", "step", "broadcast"),  # torch has no negative strides
}


def strided(rng, shape, framework, dtype, kind):
    """A non-contiguous `framework` view of `shape` and the float64 values it holds.

    transposed: axes reversed. step: every other element from offset 1 (every third in the
    last dim), so the data pointer is offset too. reversed: negative strides. broadcast:
    the first dimension has stride 0 (for rank 1 that is the inner one: a broadcast scalar).
    """
    shape = tuple(shape)
    assert kind in STRIDED_KINDS[framework], f"{framework} cannot make a {kind} view"
    if kind == "transposed":
        base = to_framework(random(rng, shape[::-1], dtype), framework, dtype)
        view = base.T if framework == "numpy" else base.permute(*reversed(range(base.ndim)))
    elif kind == "step":
        base_shape = [2 * s + 1 for s in shape[:-1]] + [3 * shape[-1]]
        base = to_framework(random(rng, base_shape, dtype), framework, dtype)
        view = base[tuple([slice(1, None, 2)] * (len(shape) - 1) + [slice(None, None, 3)])]
    elif kind == "reversed":
        base = to_framework(random(rng, shape, dtype), framework, dtype)
        view = base[(slice(None, None, -1),) * len(shape)]
    elif kind == "broadcast":
        base = to_framework(random(rng, (1,) + shape[1:], dtype), framework, dtype)
        view = np.broadcast_to(base, shape) if framework == "numpy" else base.expand(*shape)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    assert tuple(view.shape) == shape
    return view, to_float64(view)


def reference(name: str, near: str | Path | None = None):
    """The reference module of op `name`: `<name>/reference.py` in the ops folder holding `near`
    (a test file's __file__: the source beside the tests, never a stale installed copy), else
    opforge.references.<name> (installed with opforge, or kept beside a plugin)."""
    if near is not None:
        path = Path(near).resolve().parent.parent / name / "reference.py"
        if path.exists():
            spec = importlib.util.spec_from_file_location(f"{name}_reference", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    if importlib.util.find_spec(f"opforge.references.{name}") is not None:
        return importlib.import_module(f"opforge.references.{name}")
    raise ImportError(f"no reference for {name}: no {name}/reference.py beside {near}, none installed")


FORGE_BESIDE_A_GPU = ("forge is not loaded beside a GPU: torch would take it for its accelerator and fail every CUDA "
                      "backward in this process (pytorch/pytorch#161129); OPFORGE_TEST_FORGE=1 runs these tests "
                      "(in a pytest process of their own)")


def forge_testable() -> bool:
    """Whether this test process may load the forge device: not beside a GPU torch can use (see
    FORGE_BESIDE_A_GPU), unless OPFORGE_TEST_FORGE=1 says this process is for forge's tests."""
    from opforge_autoload import gpu_in_use_by_torch

    return os.environ.get("OPFORGE_TEST_FORGE") == "1" or not gpu_in_use_by_torch()


def torch_ops_dispatched(fn, arguments: bool = False) -> list:
    """Runs fn() and returns the names of the opforge ops it sent through torch's dispatcher
    below autograd, in order: what a forward or backward really ran (a saving forward in place
    of its op, a backward op or none). With arguments, (name, {argument name: value}) pairs:
    what the adapters passed (a backward op's output_mask, say)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "opforge":
                names = [a.name for a in func._schema.arguments]
                bound = {**dict(zip(names, args)), **(kwargs or {})}
                seen.append((func._opname, bound) if arguments else func._opname)
            return func(*args, **(kwargs or {}))

    with Log():
        fn()
    return seen


@pytest.fixture
def rng(request):
    """A generator with a fresh seed per test, recorded for the failure report (opforge's
    conftest prints it); OPFORGE_TEST_SEED=<seed> replays it."""
    seed = int(os.environ.get("OPFORGE_TEST_SEED") or secrets.randbits(32))
    request.node.user_properties.append(("seed", seed))
    return np.random.default_rng(seed)


@pytest.fixture(params=opforge.simd_targets())
def simd_target(request):
    """Runs the test once per SIMD target this CPU supports, pinned, so fallbacks are tested too."""
    opforge.set_simd_target(request.param)
    yield request.param
    opforge.set_simd_target("")


@pytest.fixture(params=["amx", "avx512_bf16", "fma"])
def bf16_unit(request):
    """Runs the test on each unit linear_act's bfloat16 products can take on this CPU, the AVX3
    target pinned: AMX tiles, AVX512_BF16 dot products (both flush denormals), float32 FMAs;
    skipped where this CPU (or OS) lacks the unit or AVX-512."""
    unit = request.param
    if "AVX3" not in opforge.simd_targets():
        pytest.skip("no AVX-512 on this CPU")
    if unit == "amx" and not opforge.amx_supported():
        pytest.skip("no AMX on this CPU or OS (needs AMX-BF16 and Linux's tile-state permission)")
    if unit == "avx512_bf16" and not opforge.bf16_dot_supported():
        pytest.skip("no AVX512_BF16 on this CPU")
    before = opforge.amx_enabled(), opforge.bf16_dot_enabled()  # off where the environment started them so
    opforge.set_simd_target("AVX3")
    opforge.set_amx_enabled(unit == "amx")
    opforge.set_bf16_dot_enabled(unit == "avx512_bf16")
    yield unit
    opforge.set_amx_enabled(before[0])
    opforge.set_bf16_dot_enabled(before[1])
    opforge.set_simd_target("")
