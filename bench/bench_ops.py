"""Every op against torch eager, torch.compile, jax.jit and the machine's memory bandwidth.

    python bench/bench_ops.py [--ops rms_norm,softmax] [--sizes large,l2] [--no-compile]

For each op with a reference (ops/<name>/reference.py), at a size past the caches (64 MiB per
input) and one that fits in L2 (256 KiB per input), in float32: median time of each
implementation, GB/s (bytes read + written once, from the actual arrays), % of the STREAM
bandwidth measured in the same run on the same threads, and opforge's speedup over each
competitor (their time / ours). Compute-bound ops (the reference defines `flops`: linear_act)
are reported in GFLOP/s and % of the float32 matrix-product peak measured in the same run
(torch.mm, 2048^3) instead. Writes bench/results/ops_cpu.csv and ops_cpu.png.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import numpy as np

import common

SIZES = {"large": (4096, 4096), "l2": (64, 1024)}  # (rows, cols): 64 MiB / 256 KiB per input


def implementations(name, ref, attrs, compile_torch):
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
            # Every op's lambda shares one code object; without a reset, dynamo's recompile
            # limit would silently leave later ops running eager.
            torch._dynamo.reset()
            compiled = torch.compile(lambda *a: ref.torch(*a, **attrs), dynamic=False)
            impls["torch.compile"] = (compiled, "torch")
    if hasattr(ref, "jax"):
        import jax

        impls["jax.jit"] = (jax.jit(lambda *a: ref.jax(*a, **attrs)), "jax")
    return impls


def run(ops, sizes, repeats, compile_torch, threads):
    import jax
    import torch

    import opforge

    opforge.set_num_threads(threads)
    bandwidth = common.stream_bandwidth(threads)
    peak = max(bandwidth.values())
    print(f"machine: {common.machine()}; {threads} threads for every implementation")
    gemm_peak = common.matmul_peak_gflops(threads)
    print(f"STREAM (torch, float64, 512 MiB arrays): copy {bandwidth['copy']:.1f} GB/s, add {bandwidth['add']:.1f} GB/s;"
          f" % below is of {peak:.1f} GB/s")
    print(f"float32 matrix-product peak (torch.mm 2048^3): {gemm_peak:.1f} GFLOP/s; % of it for compute-bound ops\n")
    rng = np.random.default_rng(0)
    rows = []
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
            times = {}
            for impl, (fn, kind) in implementations(name, ref, attrs, compile_torch).items():
                args = t_args if kind == "torch" else j_args
                sync = (lambda x: x.block_until_ready()) if kind == "jax" else (lambda x: x)
                times[impl] = common.median_seconds(lambda: fn(*args), repeats=repeats, sync=sync)
            flops = ref.flops(arrays) if hasattr(ref, "flops") else None
            for impl, t in times.items():
                rate, unit, limit = (flops / t / 1e9, "GFLOP/s", gemm_peak) if flops else (nbytes / t / 1e9, "GB/s", peak)
                rows.append({"op": name, "size": size, "shape": f"{r}x{c}", "impl": impl, "median_us": t * 1e6,
                             "rate": rate, "unit": unit, "pct_of_limit": 100 * rate / limit,
                             "opforge_speedup": t / times["opforge"]})
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
    args = parser.parse_args(argv)
    rows, bandwidth = run(args.ops.split(","), args.sizes.split(","), args.repeats, not args.no_compile, args.threads)
    report(rows, bandwidth)


if __name__ == "__main__":
    sys.exit(main())
