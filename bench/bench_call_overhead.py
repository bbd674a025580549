"""What one call of opforge.<op> costs on a small array: on NumPy arrays (the generic adapter)
against NumPy itself, on torch tensors (which it hands to opforge.torch.<op>) against torch
eager, and on JAX arrays (one jitted FFI call, found in C++) against jax.numpy eager, against
the generic DLPack path such calls took before, and against opforge.jax's Python binding, which
found the jitted call until C++ did (still the path of calls not on JAX arrays alone). The
torch adapter's other ways in (torch.ops.opforge, the generic DLPack path on torch tensors) are
bench_torch.py's.

    python bench/bench_call_overhead.py [--samples 60] [--calls 200]

Why: at a few elements the kernel is nothing and the call is everything (binding arguments,
reading array metadata, validating, allocating and wrapping the result; with out=, checking the
caller's array instead of allocating). The NumPy rows compare
with what a NumPy user writes instead: one ufunc for add and relu, NumPy compositions for
rms_norm and softmax (several ufuncs, each a call). opforge runs one thread here, like NumPy.

Each sample times `--calls` back-to-back calls (perf_counter's own cost would swamp one call);
the cases and both sides take turns, sample by sample, `--samples` times after one warm-up
sweep, and the table gives each one's median. µs per call; speedup
= the competitor's time / opforge's (> 1: opforge faster). Writes bench/results/call_overhead_cpu.csv
and .png.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

import common
import opforge
import opforge.jax as oj

EPS = 1e-6


def np_rms_norm(x, w):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def jnp_rms_norm(x, w):  # what a JAX user writes, run eagerly: one dispatch per operation
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def cases(shape):
    """(label, opforge call, competitor name, competitor call) on fresh float32 inputs of `shape`."""
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(shape[-1:]).astype(np.float32)
    t, u = torch.from_numpy(x.copy()), torch.from_numpy(y.copy())
    jx, jy, jw = jnp.asarray(x), jnp.asarray(y), jnp.asarray(w)
    generic_add = opforge._core.function(opforge._core.op("add"))  # no route to opforge.jax
    out, out_t = np.empty_like(x), torch.empty_like(t)  # out=: both sides write the same array
    return [
        ("add, NumPy", lambda: opforge.add(x, y), "NumPy", lambda: np.add(x, y)),
        ("relu, NumPy", lambda: opforge.relu(x), "NumPy", lambda: np.maximum(x, 0)),
        ("rms_norm, NumPy", lambda: opforge.rms_norm(x, w, EPS), "NumPy", lambda: np_rms_norm(x, w)),
        ("softmax, NumPy", lambda: opforge.softmax(x), "NumPy", lambda: np_softmax(x)),
        ("add into out=, NumPy", lambda: opforge.add(x, y, out=out), "NumPy", lambda: np.add(x, y, out=out)),
        ("add, torch tensors", lambda: opforge.add(t, u), "torch eager", lambda: torch.add(t, u)),
        ("add into out=, torch", lambda: opforge.add(t, u, out=out_t), "torch eager",
         lambda: torch.add(t, u, out=out_t)),
        # JAX dispatches asynchronously: both sides wait for their result, as a caller reading it would.
        ("add, JAX arrays", lambda: opforge.add(jx, jy).block_until_ready(), "jax.numpy",
         lambda: jnp.add(jx, jy).block_until_ready()),
        ("rms_norm, JAX arrays", lambda: opforge.rms_norm(jx, jw, EPS).block_until_ready(), "jax.numpy",
         lambda: jnp_rms_norm(jx, jw).block_until_ready()),
        ("add, JAX arrays", lambda: opforge.add(jx, jy).block_until_ready(), "DLPack path",
         lambda: generic_add(jx, jy).block_until_ready()),
        ("add via opforge.jax, JAX arrays", lambda: oj.add(jx, jy).block_until_ready(), "jax.numpy",
         lambda: jnp.add(jx, jy).block_until_ready()),
        # The Python function opforge.jax.add hands other calls to: how a call on concrete arrays
        # was bound until the jitted call was looked up in C++ (2026-11-29), the same call after.
        ("add, JAX arrays", lambda: opforge.add(jx, jy).block_until_ready(), "Python binding",
         lambda: oj.add._jax_route(jx, jy).block_until_ready()),
    ]


def check(label, ours, theirs):
    got, want = ours(), theirs()
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-6, err_msg=label)


def batch_us(fn, calls: int) -> float:
    """µs per call over `calls` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    opforge.set_num_threads(1)
    torch.set_num_threads(1)
    print(f"{common.machine()}; opforge {opforge.__version__} ({opforge.simd_target()}), NumPy {np.__version__}, "
          f"torch {torch.__version__}; float32, one thread")
    sizes = {"1": (1,), "8x16": (8, 16)}
    runs = [(size, *case) for size, shape in sizes.items() for case in cases(shape)]
    for size, label, ours, _, theirs in runs:
        check(f"{label} {size}", ours, theirs)
    # Interleaved: one batch of each case and side in turn, so the machine's noise hits all alike.
    times = {}
    for sweep in range(args.samples + 1):
        for size, label, ours, rival, theirs in runs:
            for impl, fn in (("opforge", ours), (rival, theirs)):
                us = batch_us(fn, args.calls)
                if sweep:  # the first sweep warms up
                    times.setdefault((size, label, rival, impl), []).append(us)
    rows = []
    print(f"\n{'case':<26} {'size':<5} {'opforge µs':>10} {'rival':<12} {'rival µs':>9} {'speedup':>8}")
    for size, label, _, rival, _ in runs:
        ours, theirs = (statistics.median(times[(size, label, rival, i)]) for i in ("opforge", rival))
        print(f"{label:<26} {size:<5} {ours:>10.2f} {rival:<12} {theirs:>9.2f} {theirs / ours:>7.2f}x")
        for impl, us in (("opforge", ours), (rival, theirs)):
            rows.append({"case": label, "size": size, "rival": rival, "impl": impl, "us_per_call": round(us, 3),
                         "opforge_speedup": round(theirs / ours, 3)})
    print(f"\nwrote {common.write_csv('call_overhead_cpu', rows)}")
    groups = [f"{label} {size} (vs {rival})" for size, label, _, rival, _ in runs]
    series = {"opforge": [r["us_per_call"] for r in rows if r["impl"] == "opforge"],
              "rival (NumPy, torch, jax.numpy eager, DLPack path)": [r["us_per_call"] for r in rows
                                                                     if r["impl"] != "opforge"]}
    title = "µs per call on small float32 arrays (lower is better)"
    print(f"wrote {common.bar_plot('call_overhead_cpu', title, groups, series, 'µs')}")


if __name__ == "__main__":
    main()
