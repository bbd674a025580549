"""Shared by the benchmark programs: timing, the machine's memory bandwidth, tables, CSV, PNG.

Timings are medians of repeated calls after a warm-up. Bandwidth counts bytes read plus bytes
written once each (the minimum traffic of the operation), as STREAM does.
"""

from __future__ import annotations

import csv
import os
import platform
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def median_seconds(fn, repeats: int = 20, warmup: int = 2, sync=lambda r: r, settle: float = 0.2,
                   warm_seconds: float = 0.05) -> float:
    # Thread pools spin for a while after their last job (OpenMP's, XLA's, OpenBLAS's, ours):
    # a pause first, so each implementation starts on cores the previous one has let go of.
    time.sleep(settle)
    # Then calls until the cores are awake again: after the pause the first calls of a small op
    # take 10-30x their steady time on this VM (idle vCPUs, cold caches), for every library alike.
    start = time.perf_counter()
    done = 0
    while done < warmup or time.perf_counter() - start < warm_seconds:
        sync(fn())
        done += 1
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sync(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stream_bandwidth(threads: int, n: int = 64 << 20) -> dict[str, float]:
    """STREAM-style copy and add over `n` float64 per array (512 MiB each: far past every cache),
    on `threads` threads through torch's kernels (multithreaded, vectorized; the
    reference point every op is measured against). GB/s counting bytes read + written."""
    import torch

    torch.set_num_threads(threads)
    a, b, c = (torch.rand(n, dtype=torch.float64) for _ in range(3))
    copy = median_seconds(lambda: c.copy_(a), repeats=5)
    add = median_seconds(lambda: torch.add(a, b, out=c), repeats=5)
    return {"copy": 2 * 8 * n / copy / 1e9, "add": 3 * 8 * n / add / 1e9}


class ReadBandwidth:
    """The memory's read bandwidth, the limit of a product whose weight comes from DRAM: a sum over
    512 MiB through torch's multithreaded kernels. Call once per round, beside what it bounds (the
    VM's bandwidth moves from minute to minute); `median` in GB/s."""

    def __init__(self):
        import torch

        self.big = torch.rand(128 << 20)
        self.samples = []

    def __call__(self) -> None:
        self.samples.append(self.big.nbytes / median_seconds(lambda: self.big.sum(), repeats=5) / 1e9)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def line(self) -> str:
        return (f"memory read bandwidth (torch sum over 512 MiB): {self.median:.1f} GB/s, median of "
                + ", ".join(f"{r:.0f}" for r in self.samples))


def matmul_peak_gflops(threads: int, n: int = 2048) -> float:
    """The float32 matrix-product rate torch's BLAS reaches on `threads` threads: the practical
    FMA peak that compute-bound ops are measured against."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.rand(n, n), torch.rand(n, n)
    return 2 * n**3 / median_seconds(lambda: torch.mm(a, b), repeats=5) / 1e9


def compile_per_case(fn, tag: str):
    """torch.compile(fn) with a compile cache of its own. Dynamo caches compiled graphs per code
    object, and lambdas made in one loop share one: past its recompile limit later cases would
    silently run eager. A copy of the code object per case (named `tag`) gives each its own."""
    import types

    import torch

    own = types.FunctionType(fn.__code__.replace(co_name=tag), fn.__globals__, None, fn.__defaults__, fn.__closure__)
    return torch.compile(own, dynamic=False)


def sample_inputs(ref, rng, rows: int, cols: int):
    """An op's reference sample at rows x cols as (NumPy arrays, attrs, torch tensors, JAX arrays):
    float data in float32; integer inputs (indices, ggml blocks) keep their type."""
    import jax
    import numpy as np
    import torch

    arrays, attrs = ref.sample(rng, rows=rows, cols=cols)
    arrays = [a.astype(np.float32) if a.dtype == np.float64 else a for a in arrays]
    return arrays, attrs, [torch.from_numpy(a) for a in arrays], [jax.device_put(a) for a in arrays]


def sweep(cases, threads: int, repeats: int, rounds: int):
    """Times every implementation of every case, the whole sweep `rounds` times (STREAM and the
    matmul peak measured again each round). A case is (op, size, rows, cols, bytes, flops or
    None, {implementation: (zero-argument callable, "torch" or "jax")}). On a shared machine
    noise comes in bursts of seconds: a burst then spoils one round of a row, not the figure.
    Returns (rows for report(), the bandwidth limit in GB/s)."""
    import jax

    bandwidths, peaks, times = [], [], {}
    for _ in range(rounds):
        bandwidths.append(stream_bandwidth(threads))
        peaks.append(matmul_peak_gflops(threads))
        for name, size, _, _, _, _, impls in cases:
            for impl, (fn, kind) in impls.items():
                sync = jax.block_until_ready if kind == "jax" else (lambda x: x)
                times.setdefault((name, size, impl), []).append(median_seconds(fn, repeats=repeats, sync=sync))
    bandwidth = {k: statistics.median(b[k] for b in bandwidths) for k in bandwidths[0]}
    peak, gemm_peak = max(bandwidth.values()), statistics.median(peaks)
    print(f"STREAM (torch, float64, 512 MiB arrays): copy {bandwidth['copy']:.1f} GB/s, add {bandwidth['add']:.1f} GB/s;"
          f" % below is of {peak:.1f} GB/s")
    print(f"float32 matrix-product peak (torch.mm 2048^3): {gemm_peak:.1f} GFLOP/s; % of it for compute-bound ops\n")
    rows = []
    for name, size, r, c, nbytes, flops, impls in cases:
        ours = statistics.median(times[(name, size, "opforge")])
        for impl in impls:
            t = statistics.median(times[(name, size, impl)])
            rate, unit, limit = (flops / t / 1e9, "GFLOP/s", gemm_peak) if flops else (nbytes / t / 1e9, "GB/s", peak)
            rows.append({"op": name, "size": size, "shape": f"{r}x{c}", "impl": impl, "median_us": t * 1e6,
                         "rate": rate, "unit": unit, "pct_of_limit": 100 * rate / limit, "opforge_speedup": t / ours})
    return rows, peak


def start_against_torch(parser, inputs):
    """For a program timing opforge against torch eager: adds --repeats and --rounds to `parser`,
    parses it, gives torch opforge's thread count and prints what runs where (`inputs(args)`
    describes the data). Returns the arguments."""
    import opforge
    import torch

    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    threads = opforge.num_threads()
    torch.set_num_threads(threads)
    print(f"{machine()}; opforge {opforge.__version__} ({opforge.simd_target()}), torch {torch.__version__}, "
          f"{threads} threads each; {inputs(args)}")
    return args


def sweep_arguments(doc: str, default_ops: list[str]):
    """The command line of a sweep program (--ops, --sizes, --repeats, --threads, --no-compile,
    --rounds), parsed."""
    import argparse

    import opforge

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default=",".join(default_ops))
    parser.add_argument("--sizes", default="large,l2")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=opforge.num_threads())
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (slow to compile)")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the whole sweep; report medians over rounds")
    return parser


def report(rows, peak: float, name: str, title: str, ylabel: str = "GB/s") -> None:
    """Prints sweep()'s rows, writes them to results/<name>.csv and the memory-bound ones to
    results/<name>.png against the bandwidth limit."""
    print(f"{'op':<12} {'size':<6} {'impl':<14} {'median µs':>10} {'rate':>16} {'% limit':>8} {'opforge speedup':>16}")
    for r in rows:
        speed = "" if r["impl"] == "opforge" else f"{r['opforge_speedup']:.2f}x"
        print(f"{r['op']:<12} {r['size']:<6} {r['impl']:<14} {r['median_us']:>10.1f} {r['rate']:>8.1f} {r['unit']:<7} "
              f"{r['pct_of_limit']:>7.0f}% {speed:>16}")
    print(f"\nwrote {write_csv(name, rows)}")
    memory_bound = [r for r in rows if r["unit"] == "GB/s"]
    impls = list(dict.fromkeys(r["impl"] for r in memory_bound))
    groups = list(dict.fromkeys(f"{r['op']} {r['size']}" for r in memory_bound))
    series = {i: [next((r["rate"] for r in memory_bound if f"{r['op']} {r['size']}" == g and r["impl"] == i), 0)
                  for g in groups] for i in impls}
    print(f"wrote {bar_plot(name, title, groups, series, ylabel, peak, 'STREAM')}")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs visible"


def write_csv(name: str, rows: list[dict]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def bar_plot(name: str, title: str, groups: list[str], series: dict[str, list[float]], ylabel: str,
             line: float | None = None, line_label: str = "", out_dir: Path = RESULTS) -> Path:
    """Grouped bars (one group per op/size, one bar per implementation), optional reference line;
    written to out_dir/<name>.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, len(groups) * 1.2), 4.5))
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        ax.bar([g + i * width for g in range(len(groups))], values, width, label=label)
    if line:
        ax.axhline(line, color="black", linestyle="--", linewidth=1, label=line_label)
    ax.set_xticks([g + width * (len(series) - 1) / 2 for g in range(len(groups))], groups, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(out_dir) / f"{name}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
