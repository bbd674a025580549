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


def matmul_peak_gflops(threads: int, n: int = 2048) -> float:
    """The float32 matrix-product rate torch's BLAS reaches on `threads` threads: the practical
    FMA peak that compute-bound ops are measured against."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.rand(n, n), torch.rand(n, n)
    return 2 * n**3 / median_seconds(lambda: torch.mm(a, b), repeats=5) / 1e9


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
