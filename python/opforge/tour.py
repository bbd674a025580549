"""The tour: every op, in every installed framework, against that framework's own reference.

For each op and framework it runs opforge on that framework's arrays, checks the result
against the op's reference written in the same framework (ops/<name>/reference.py), and times
both (median of repeated calls, after a warm-up). The ratio is reference time / opforge time:
above 1 means opforge is faster. The ggml-format ops have no framework counterpart; where
ggml's own library is found (opforge.ggml_cpu) they are also run against it ("ggml" rows).
"""

from __future__ import annotations

import csv
import importlib
import importlib.util
import math
import statistics
import time

import numpy as np

import opforge

DTYPE = "float32"


def _adapter(module: str, name: str):
    """opforge's function for op `name` in the framework adapter `module`, if it loads."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _framework(name: str):
    """(to_native, to_numpy, sync, jit, adapter) for an installed framework, or None.
    `adapter` is the module through which that framework's users call opforge (the
    framework's own adapter where it is built); the generic DLPack call otherwise."""
    if name == "numpy":
        return (lambda a: a, np.asarray, lambda r: r, lambda f: f, "opforge")
    if name == "ggml":  # ggml's own library on NumPy arrays, where one is found (opforge.ggml_cpu)
        from opforge import ggml_cpu

        return (lambda a: a, np.asarray, lambda r: r, lambda f: f, "opforge") if ggml_cpu.load() else None
    if importlib.util.find_spec(name) is None:
        return None
    if name == "torch":
        import torch

        return (lambda a: torch.from_numpy(a), lambda t: t.numpy(), lambda r: r, lambda f: f,
                "opforge.torch")
    if name == "jax":
        import jax

        def sync(r):
            return r.block_until_ready() if hasattr(r, "block_until_ready") else r

        return (lambda a: jax.device_put(a), np.asarray, sync, jax.jit, "opforge.jax")
    return None


def _median_us(fn, sync, repeats: int) -> float:
    sync(fn())  # warm-up: compilation, caches, thread pool start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sync(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _rows(frameworks, rows, cols, repeats):
    rng = np.random.default_rng()
    for name in opforge._core.op_names():
        try:
            ref = importlib.import_module(f"opforge.references.{name}")
        except ModuleNotFoundError:
            yield {"op": name, "framework": "-", "note": "no reference.py"}
            continue
        arrays, attrs = ref.sample(rng, rows=rows, cols=cols)
        for fw in frameworks:
            tools = _framework(fw)
            if tools is None or not hasattr(ref, fw):
                continue
            to_native, to_numpy, sync, jit, adapter = tools
            fn = _adapter(adapter, name)
            if fn is None:  # adapter not built: the generic DLPack call still works
                adapter, fn = "opforge", getattr(opforge, name)
            # Float data in the tour's dtype; integer inputs (indices) stay integers.
            args = [sync(to_native(a.astype(DTYPE) if a.dtype == np.float64 else a)) for a in arrays]
            # Attributes are static: close over them, and jit both sides alike.
            ours_call = jit(lambda *a, _f=fn: _f(*a, **attrs)) if adapter == "opforge.jax" else (
                lambda *a, _f=fn: _f(*a, **attrs))
            # A reference that is NumPy in disguise (ggml's formats: no framework has them) is
            # only a correctness check: it cannot be traced by jit, and timing it would compare
            # opforge with a NumPy transcription, not with the framework.
            framework_native = fw == "ggml" or getattr(ref, "FRAMEWORK_NATIVE", True)
            reference = lambda *a, _f=getattr(ref, fw): _f(*a, **attrs)  # noqa: E731
            native = jit(reference) if framework_native else reference
            got = to_numpy(sync(ours_call(*args))).astype(np.float64)
            want = to_numpy(sync(native(*args))).astype(np.float64)
            scale = max(1.0, float(np.abs(want).max(initial=0.0)))
            ours = _median_us(lambda: ours_call(*args), sync, repeats)
            theirs = _median_us(lambda: native(*args), sync, repeats) if framework_native else float("nan")
            yield {
                "op": name,
                "framework": fw,
                "backend": getattr(opforge, name).op.backend_for(*args, **attrs),
                "path": adapter + (" (jit)" if adapter == "opforge.jax" else ""),
                "dtype": DTYPE,
                "shape": "x".join(map(str, arrays[0].shape)),
                "max_error": float(np.abs(got - want).max(initial=0.0)) / scale,
                "opforge_us": ours,
                "native_us": theirs,
                "ratio": theirs / ours,
                "native": f"{fw}{' (jit)' if fw == 'jax' else ''}" if framework_native else "numpy ref",
            }


def run_tour(frameworks, rows=512, cols=1024, repeats=30, csv_path=None) -> int:
    info = opforge.info()
    print(f"opforge {info['version']} tour: SIMD {info['simd_chosen']}, {info['num_threads']} threads, "
          f"backends: " + ", ".join(b["name"] + ("" if b["available"] else " (unavailable)") for b in info["backends"]))
    print("max error: max |opforge - reference| / max(1, max |reference|); "
          "ratio: reference time / opforge time (>1: opforge faster)\n")
    header = (f"{'op':<18} {'framework':<10} {'opforge via':<20} {'backend':<8} {'shape':<10} {'max error':>10} "
              f"{'opforge µs':>11} {'native µs':>10} {'ratio':>7}")
    print(header)
    print("-" * len(header))
    rows_out = []
    skipped = []
    failures = 0
    for r in _rows(frameworks, rows, cols, repeats):
        rows_out.append(r)
        if "note" in r:
            skipped.append(r["op"])
            continue
        flag = "" if r["max_error"] < 1e-4 else "  <-- MISMATCH"
        failures += bool(flag)
        untimed = math.isnan(r["native_us"])  # a NumPy-transcription reference
        theirs = f"{'-':>10} {'-':>7}" if untimed else f"{r['native_us']:>10.1f} {r['ratio']:>6.2f}x"
        print(f"{r['op']:<18} {r['native']:<10} {r['path']:<20} {r['backend']:<8} {r['shape']:<10} {r['max_error']:>10.2e} "
              f"{r['opforge_us']:>11.1f} {theirs}{flag}")
    if skipped:
        print("\nwithout a reference.py (backward ops and saving forwards are checked by their tests and through "
              f"autograd): {', '.join(skipped)}")
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            fields = ["op", "framework", "path", "backend", "dtype", "shape", "max_error", "opforge_us", "native_us", "ratio"]
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(r for r in rows_out if "note" not in r)
        print(f"\nwrote {csv_path}")
    return 1 if failures else 0
