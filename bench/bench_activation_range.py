"""The activations over the range of their inputs, against torch eager: the same op on standard
normal values times a scale (1, 4, 8, 22), since the work per element depends on it.

    python bench/bench_activation_range.py [--scales 1,4,8,22] [--n 4194304] [--rounds 3]

Why: opforge's exact gelu keeps relative accuracy far into the left tail (Phi from erfc), and
its CPU kernels take a tabulated path for the lanes with |x| < 4 (16 for silu's sigmoid), a
longer erfc/exp path for the others (a vector with lanes on both sides computes both).
Pre-activations of an unnormalized product (randn weights) sit far out: scale 22 is x @ w^T
for x, w of 500 standard normal columns. Before 2026-11-27 that path made subnormal floats (exp
at its flush point, Phi(-13)), each a ~150-cycle microcode assist on Intel: gelu ran 10x slower
than torch there (tests/cpp/test_subnormals.cc).

float32, n elements (16 MiB at the default: past L2, inside this machine's L3), opforge's
thread count for both libraries. Medians of `--repeats` calls, then the median over `--rounds`
sweeps. ns per element; speedup = torch's time / opforge's (> 1: opforge faster). Writes
bench/results/activation_range_cpu.csv and .png.
"""

import argparse
import statistics

import numpy as np
import torch

import common
import opforge.torch  # noqa: F401  (registers torch.ops.opforge)

OPS = {  # name: (opforge, torch), each f(x, g)
    "gelu": (lambda x, g: torch.ops.opforge.gelu(x, "none"), lambda x, g: torch.nn.functional.gelu(x)),
    "gelu_backward": (lambda x, g: torch.ops.opforge.gelu_backward(g, x, "none"),
                      lambda x, g: torch.ops.aten.gelu_backward(g, x)),
    "gelu tanh": (lambda x, g: torch.ops.opforge.gelu(x, "tanh"),
                  lambda x, g: torch.nn.functional.gelu(x, approximate="tanh")),
    "silu": (lambda x, g: torch.ops.opforge.silu(x), lambda x, g: torch.nn.functional.silu(x)),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--scales", default="1,4,8,22")
    parser.add_argument("--n", type=int, default=1 << 22)
    args = common.start_against_torch(parser, lambda a: f"float32, {a.n} elements")
    rng = np.random.default_rng(0)
    scales = [float(s) for s in args.scales.split(",")]
    inputs = {s: torch.from_numpy((rng.standard_normal(args.n) * s).astype(np.float32)) for s in scales}
    g = torch.from_numpy(rng.standard_normal(args.n).astype(np.float32))
    times = {}
    for _ in range(args.rounds):
        for s in scales:
            for op, (ours, theirs) in OPS.items():
                for impl, fn in (("opforge", ours), ("torch eager", theirs)):
                    t = common.median_seconds(lambda: fn(inputs[s], g), repeats=args.repeats)
                    times.setdefault((op, s, impl), []).append(t)
    rows = []
    print(f"\n{'op':<14} {'scale':>5} {'opforge ns/elem':>16} {'torch ns/elem':>14} {'speedup':>8}")
    for op in OPS:
        for s in scales:
            ours, theirs = (statistics.median(times[(op, s, i)]) for i in ("opforge", "torch eager"))
            print(f"{op:<14} {s:>5g} {ours * 1e9 / args.n:>16.3f} {theirs * 1e9 / args.n:>14.3f} "
                  f"{theirs / ours:>7.2f}x")
            for impl, t in (("opforge", ours), ("torch eager", theirs)):
                rows.append({"op": op, "scale": s, "impl": impl, "ns_per_element": t * 1e9 / args.n,
                             "opforge_speedup": t / ours})
    print(f"\nwrote {common.write_csv('activation_range_cpu', rows)}")
    groups = [f"{op} x{s:g}" for op in OPS for s in scales]
    series = {impl: [r["ns_per_element"] for r in rows if r["impl"] == impl] for impl in ("opforge", "torch eager")}
    plot = common.bar_plot("activation_range_cpu", "activations by input scale (lower is better)", groups, series,
                           "ns per element")
    print(f"wrote {plot}")


if __name__ == "__main__":
    main()
