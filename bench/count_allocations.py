"""Heap allocations (malloc calls) one opforge call makes, against NumPy's and torch's own.

    python bench/count_allocations.py

Why: at a few elements a call's time is its bookkeeping, and each malloc and its free cost
about as much as reading a small array's metadata. The count is exact and the same run after
run, unlike the microsecond timings of bench_call_overhead.py, so it shows what a change to
the call path saved where timings on a noisy machine cannot.

How: a malloc wrapper (C, compiled here with `cc`, loaded with LD_PRELOAD into a child Python)
counts calls between two markers around one call; each case runs 3000 times first (caches,
lazily made objects), and the count given is the smallest of 50 calls. Linux only. Writes
bench/results/allocations_cpu.csv.
"""

import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

COUNTER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
static void* (*real_malloc)(size_t);
static long counted;
static int counting;
void* malloc(size_t n) {
  if (!real_malloc) real_malloc = (void* (*)(size_t))dlsym(RTLD_NEXT, "malloc");
  if (counting) counted++;
  return real_malloc(n);
}
void count_start(void) { counted = 0; counting = 1; }
long count_stop(void) { counting = 0; return counted; }
"""


def cases():
    import numpy as np
    import torch

    import opforge

    xn, yn, on = (np.ones(16, np.float32) for _ in range(3))
    xt, yt, ot = torch.ones(16), torch.ones(16), torch.empty(16)
    return [
        ("nothing (the harness itself)", "-", lambda: None),
        ("add", "np.add", lambda: np.add(xn, yn)),
        ("add", "opforge, NumPy", lambda: opforge.add(xn, yn)),
        ("add into out=", "np.add", lambda: np.add(xn, yn, out=on)),
        ("add into out=", "opforge, NumPy", lambda: opforge.add(xn, yn, out=on)),
        ("relu", "opforge, NumPy", lambda: opforge.relu(xn)),
        ("rms_norm", "opforge, NumPy", lambda: opforge.rms_norm(xn, yn)),
        ("add", "torch.add", lambda: torch.add(xt, yt)),
        ("add", "opforge, torch", lambda: opforge.add(xt, yt)),
        ("add into out=", "torch.add", lambda: torch.add(xt, yt, out=ot)),
        ("add into out=", "opforge, torch", lambda: opforge.add(xt, yt, out=ot)),
    ]


def child(library: str, results: Path) -> None:
    import ctypes

    import torch

    import opforge

    torch.set_num_threads(1)
    opforge.set_num_threads(1)
    counter = ctypes.CDLL(library)
    counter.count_stop.restype = ctypes.c_long
    rows = []
    for op, who, call in cases():
        for _ in range(3000):
            call()
        counts = []
        for _ in range(50):
            counter.count_start()
            call()
            counts.append(counter.count_stop())
        rows.append((op, who, min(counts)))
    print(f"{'case':28s} {'who':16s} mallocs per call")
    for op, who, n in rows:
        print(f"{op:28s} {who:16s} {n}")
    with results.open("w", newline="") as f:  # csv quotes the names with commas in them
        writer = csv.writer(f)
        writer.writerow(["case", "who", "mallocs_per_call"])
        writer.writerows(rows)
    print(f"\nwrote {results}")


def main() -> None:
    results = Path(__file__).resolve().parent / "results" / "allocations_cpu.csv"
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2], results)
        return
    with tempfile.TemporaryDirectory() as tmp:
        source, library = Path(tmp) / "count_malloc.c", Path(tmp) / "count_malloc.so"
        source.write_text(COUNTER)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(source), "-o", str(library), "-ldl"], check=True)
        env = dict(os.environ, LD_PRELOAD=str(library))
        subprocess.run([sys.executable, __file__, "--child", str(library)], env=env, check=True)


if __name__ == "__main__":
    main()
