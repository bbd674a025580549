"""opforge's ops between torch's, as in a model: each op right after a torch matmul, against the
same op from torch eager in the same place.

    python bench/bench_interleaved.py [--rows 64] [--cols 1024] [--rounds 5]

Each call of the op is timed on its own, right after a torch matmul `x @ w.T` (rows x cols by
cols x cols, multi-threaded) on the same thread. Between torch's ops its OpenMP threads keep spinning on the cores: an op that brings its
own threads pays for the fight (opforge's torch adapters run their chunks on torch's pool for
that reason, include/opforge/parallel.h). "alone" is the op called back to back with itself.
"opforge (own pool)" is the same run in a second process with OPFORGE_FOREIGN_POOL=0 (opforge's
own pool under torch too). Medians of 40 calls, median over rounds; speedup = torch's time /
opforge's (> 1: opforge faster).
Writes bench/results/interleaved_cpu.csv and .png.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import common
import opforge
import opforge.torch as ot


def after_matmul(op, x, w, calls=40):
    """Median seconds of op(h), each call right after h = x @ w.T (not timed)."""
    times = []
    for _ in range(calls + 2):
        h = x @ w.T
        start = time.perf_counter()
        op(h)
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the own-pool run's output
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(opforge.num_threads())
    x = torch.randn(args.rows, args.cols)
    w = torch.randn(args.cols, args.cols) / args.cols**0.5
    y, nw = torch.randn(args.rows, args.cols), torch.ones(args.cols)
    ops = {
        "gelu": (ot.gelu, F.gelu),
        "silu": (ot.silu, F.silu),
        "add": (lambda h: ot.add(h, y), lambda h: torch.add(h, y)),
        "rms_norm": (lambda h: ot.rms_norm(h, nw), lambda h: F.rms_norm(h, (args.cols,), nw)),
        "softmax": (lambda h: ot.softmax(h), lambda h: torch.softmax(h, -1)),
    }
    if not args.json:
        print(f"{common.machine()}; opforge {opforge.__version__}, torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads; {args.rows} x {args.cols} float32")
    times = {}
    for _ in range(args.rounds):
        for name, (ours, theirs) in ops.items():
            for impl, fn in (("opforge", ours), ("torch eager", theirs)):
                after = after_matmul(fn, x, w)
                alone = common.median_seconds(lambda: fn(x), 40)
                times.setdefault((name, impl, "after a matmul"), []).append(after)
                times.setdefault((name, impl, "alone"), []).append(alone)
    medians = {"|".join(key): statistics.median(v) for key, v in times.items()}
    if args.json:
        print(json.dumps(medians))
        return
    own = subprocess.run([sys.executable, __file__, "--json", "--rows", str(args.rows), "--cols", str(args.cols),
                          "--rounds", str(args.rounds)], env=dict(os.environ, OPFORGE_FOREIGN_POOL="0"),
                         capture_output=True, text=True, check=True)
    own_pool = json.loads(own.stdout.strip().splitlines()[-1])
    rows = []
    print(f"\n{'op':<10} {'where':<16} {'opforge us':>11} {'own pool us':>12} {'torch us':>9} {'opforge speedup':>16}")
    for name in ops:
        for where in ("after a matmul", "alone"):
            ours, theirs = medians[f"{name}|opforge|{where}"], medians[f"{name}|torch eager|{where}"]
            pool = own_pool[f"{name}|opforge|{where}"]
            print(f"{name:<10} {where:<16} {ours * 1e6:>11.1f} {pool * 1e6:>12.1f} {theirs * 1e6:>9.1f} "
                  f"{theirs / ours:>15.2f}x")
            rows.append({"op": name, "where": where, "opforge_us": ours * 1e6, "opforge_own_pool_us": pool * 1e6,
                         "torch_us": theirs * 1e6, "opforge_speedup": theirs / ours})
    print(f"\nwrote {common.write_csv('interleaved_cpu', rows)}")
    groups = [f"{r['op']} {r['where']}" for r in rows]
    series = {"opforge": [r["opforge_us"] for r in rows], "opforge (own pool)": [r["opforge_own_pool_us"] for r in rows],
              "torch eager": [r["torch_us"] for r in rows]}
    print(f"wrote {common.bar_plot('interleaved_cpu', 'ops between torch matmuls (CPU)', groups, series, 'us')}")


if __name__ == "__main__":
    main()
