"""Every op against torch eager, torch.compile, jax.jit and the machine's memory bandwidth.

    python bench/bench_ops.py [--ops rms_norm,softmax] [--sizes large,l2] [--no-compile] [--rounds 3]

For each op with a reference (ops/<name>/reference.py), at a size past the caches (64 MiB per
input) and one that fits in L2 (256 KiB per input), in float32: median time of each
implementation, GB/s (bytes read + written once, from the actual arrays), % of the STREAM
bandwidth measured in the same run on the same threads, and opforge's speedup over each
competitor (their time / ours). Compute-bound ops (the reference defines `flops`: linear_act)
are reported in GFLOP/s and % of the float32 matrix-product peak measured in the same run
(torch.mm, 2048^3) instead. With --rounds N the sweep runs N times and each figure is the median
over rounds (the committed results: --rounds 3). Writes bench/results/ops_cpu.csv and ops_cpu.png.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import types

import numpy as np

import common

SIZES = {"large": (4096, 4096), "l2": (64, 1024)}  # (rows, cols): 64 MiB / 256 KiB per input


def implementations(name, size, ref, attrs, compile_torch):
    """name -> (callable on torch tensors or jax arrays, which inputs it takes)."""
    import torch

    import opforge.torch

    # opforge as a torch user calls it: opforge.torch.<op> (the direct call on CPU tensors).
    impls = {"opforge": (lambda *a: getattr(opforge.torch, name)(*a, **attrs), "torch")}
    if not getattr(ref, "FRAMEWORK_NATIVE", True):  # the "framework" entries are NumPy in disguise
        return impls
    if hasattr(ref, "torch"):
        impls["torch eager"] = (lambda *a: ref.torch(*a, **attrs), "torch")
        if compile_torch:
            # Dynamo caches compiled graphs per code object, and every op's lambda shares one:
            # past its recompile limit later ops would silently run eager. A copy of the code
            # object per op and size gives each its own cache.
            fn = lambda *a: ref.torch(*a, **attrs)  # noqa: E731
            fn = types.FunctionType(fn.__code__.replace(co_name=f"{name}_{size}"), fn.__globals__, None, None,
                                    fn.__closure__)
            impls["torch.compile"] = (torch.compile(fn, dynamic=False), "torch")
    if hasattr(ref, "jax"):
        import jax

        impls["jax.jit"] = (jax.jit(lambda *a: ref.jax(*a, **attrs)), "jax")
    return impls


def run(ops, sizes, repeats, compile_torch, threads, rounds=1):
    """The whole sweep `rounds` times (STREAM and matmul peak included), then per op, size and
    implementation the median over rounds of each round's median: on a shared machine noise
    comes in bursts of seconds, and a burst then spoils one round of a row, not the figure."""
    import jax
    import torch

    import opforge

    opforge.set_num_threads(threads)
    print(f"machine: {common.machine()}; {threads} threads for every implementation; {rounds} round(s)")
    cases = []  # (name, size, r, c, attrs, nbytes, flops, implementations, t_args, j_args)
    rng = np.random.default_rng(0)
    for name in ops:
        ref = importlib.import_module(f"opforge.references.{name}")
        for size in sizes:
            r, c = SIZES[size]
            arrays, attrs = ref.sample(rng, rows=r, cols=c)
            # Float data in float32; integer inputs (indices, ggml blocks) keep their type.
            arrays = [a.astype(np.float32) if a.dtype == np.float64 else a for a in arrays]
            t_args = [torch.from_numpy(a) for a in arrays]
            j_args = [jax.device_put(a) for a in arrays]
            out = getattr(opforge, name)(*t_args, **attrs)
            nbytes = sum(a.numel() * a.element_size() for a in t_args) + out.numel() * out.element_size()
            flops = ref.flops(arrays) if hasattr(ref, "flops") else None
            cases.append((name, size, r, c, nbytes, flops, implementations(name, size, ref, attrs, compile_torch), t_args,
                          j_args))
    bandwidths, peaks, times = [], [], {}
    for _ in range(rounds):
        bandwidths.append(common.stream_bandwidth(threads))
        peaks.append(common.matmul_peak_gflops(threads))
        for name, size, _, _, _, _, impls, t_args, j_args in cases:
            for impl, (fn, kind) in impls.items():
                args = t_args if kind == "torch" else j_args
                sync = (lambda x: x.block_until_ready()) if kind == "jax" else (lambda x: x)
                times.setdefault((name, size, impl), []).append(
                    common.median_seconds(lambda: fn(*args), repeats=repeats, sync=sync))
    bandwidth = {k: statistics.median(b[k] for b in bandwidths) for k in bandwidths[0]}
    peak, gemm_peak = max(bandwidth.values()), statistics.median(peaks)
    print(f"STREAM (torch, float64, 512 MiB arrays): copy {bandwidth['copy']:.1f} GB/s, add {bandwidth['add']:.1f} GB/s;"
          f" % below is of {peak:.1f} GB/s")
    print(f"float32 matrix-product peak (torch.mm 2048^3): {gemm_peak:.1f} GFLOP/s; % of it for compute-bound ops\n")
    rows = []
    for name, size, r, c, nbytes, flops, impls, _, _ in cases:
        ours = statistics.median(times[(name, size, "opforge")])
        for impl in impls:
            t = statistics.median(times[(name, size, impl)])
            rate, unit, limit = (flops / t / 1e9, "GFLOP/s", gemm_peak) if flops else (nbytes / t / 1e9, "GB/s", peak)
            rows.append({"op": name, "size": size, "shape": f"{r}x{c}", "impl": impl, "median_us": t * 1e6,
                         "rate": rate, "unit": unit, "pct_of_limit": 100 * rate / limit, "opforge_speedup": t / ours})
    return rows, bandwidth


def report(rows, bandwidth):
    print(f"{'op':<12} {'size':<6} {'impl':<14} {'median µs':>10} {'rate':>16} {'% limit':>8} {'opforge speedup':>16}")
    for r in rows:
        speed = "" if r["impl"] == "opforge" else f"{r['opforge_speedup']:.2f}x"
        print(f"{r['op']:<12} {r['size']:<6} {r['impl']:<14} {r['median_us']:>10.1f} {r['rate']:>8.1f} {r['unit']:<7} "
              f"{r['pct_of_limit']:>7.0f}% {speed:>16}")
    print(f"\nwrote {common.write_csv('ops_cpu', rows)}")
    memory_bound = [r for r in rows if r["unit"] == "GB/s"]
    impls = list(dict.fromkeys(r["impl"] for r in memory_bound))
    groups = list(dict.fromkeys(f"{r['op']} {r['size']}" for r in memory_bound))
    series = {i: [next((r["rate"] for r in memory_bound if f"{r['op']} {r['size']}" == g and r["impl"] == i), 0)
                  for g in groups] for i in impls}
    peak = max(bandwidth.values())
    print(f"wrote {common.bar_plot('ops_cpu', 'opforge vs competitors (float32, CPU)', groups, series, 'GB/s', peak, 'STREAM')}")


def main(argv=None):
    import opforge

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    with_refs = [n for n in opforge._core.op_names()
                 if importlib.util.find_spec(f"opforge.references.{n}") and not n.endswith("_backward")]
    parser.add_argument("--ops", default=",".join(with_refs))
    parser.add_argument("--sizes", default="large,l2")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=opforge.num_threads())
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (slow to compile)")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the whole sweep; report medians over rounds")
    args = parser.parse_args(argv)
    rows, bandwidth = run(args.ops.split(","), args.sizes.split(","), args.repeats, not args.no_compile, args.threads,
                          args.rounds)
    report(rows, bandwidth)


if __name__ == "__main__":
    sys.exit(main())
