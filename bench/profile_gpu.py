"""Where a call's time goes on the GPU, for the ops furthest from the copy bandwidth in
bench/results/ops_cuda.md: scatter_add (its index check waits for the device once per call) and
matmul_q (a token, a small batch, a prompt), the quantizer beside them. bench/ncu_kernels.py reads
the hardware counters of the same cases.

For each, torch.profiler's device time per kernel (averaged over the calls) beside the wall time
per call with the GPU's queue drained after every call: a call whose wall time is far above the sum
of its kernels' is the host's (launches, allocation, the wait); one whose kernels add up to it is
the kernels'. Prints a table and writes profile_cuda.txt beside the benchmark's tables.

    python bench/profile_gpu.py [--calls 20] [--out bench/results]

--dry-run runs it on the CPU at toy sizes (for its test; the numbers mean nothing, and there are
no device kernels to list).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def cases(torch, opforge, device, small):
    """(label, fn) pairs: each fn one call of the op on inputs made once."""
    rng = np.random.default_rng(0)
    rows, cols, n = (256, 64, 256) if small else (16384, 4096, 4096)
    src = torch.from_numpy(rng.standard_normal((rows, cols), dtype=np.float32)).to(device)
    index = torch.from_numpy(rng.integers(0, 16, rows)).to(device)
    yield f"scatter_add {rows}x{cols} into 16", lambda: torch.ops.opforge.scatter_add(src, index, 16, 0)
    yield f"quantize_q8_0 {rows}x{cols}", lambda: torch.ops.opforge.quantize_q8_0(src)
    for fmt in ("q4_0", "q8_0"):
        w = getattr(opforge, f"quantize_{fmt}")(rng.standard_normal((n, n), dtype=np.float32))
        w = torch.from_numpy(w).to(device)
        for m in (1, 32, 512):
            x = torch.from_numpy(rng.standard_normal((m, n), dtype=np.float32)).to(device)
            yield f"matmul_q {fmt} {m}x{n} @ {n}x{n}^T", (lambda x=x, w=w, fmt=fmt: torch.ops.opforge.matmul_q(x, w, fmt))


def wall_per_call_us(torch, fn, calls, device):
    """Median wall time of one call and the wait for its work."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def device_kernels(torch, fn, calls, device):
    """[(kernel name, launches per call, device µs per call)] from torch.profiler, slowest first."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
    kernels = []
    for event in prof.key_averages():
        if str(getattr(event, "device_type", "")).endswith("CUDA"):
            total = getattr(event, "self_device_time_total", None)
            if total is None:  # older torch
                total = getattr(event, "self_cuda_time_total", 0.0)
            kernels.append((event.key, event.count / calls, total / calls))
    return sorted(kernels, key=lambda k: -k[2])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--dry-run", action="store_true", help="the CPU at toy sizes (for its test)")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("profile_gpu.py: torch is not installed")
        return 0
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("profile_gpu.py: no CUDA device; nothing to profile")
        return 0
    import opforge
    import opforge.torch  # noqa: F401  (torch.ops.opforge)

    name = torch.cuda.get_device_name(0) if device == "cuda" else "the CPU (--dry-run: not a measurement)"
    lines = [f"# Where the time goes: opforge on {name} (torch {torch.__version__})",
             f"# wall: median of {args.calls} calls, each waited for; kernels: torch.profiler's device time per call", ""]
    for label, fn in cases(torch, opforge, device, args.dry_run):
        for _ in range(3):  # warm: allocator caches, cuBLASLt/cub plans, first-launch module loads
            fn()
        wall = wall_per_call_us(torch, fn, args.calls, device)
        kernels = device_kernels(torch, fn, args.calls, device)
        busy = sum(k[2] for k in kernels)
        lines.append(f"{label}: wall {wall:.1f} us per call, kernels {busy:.1f} us "
                     f"({sum(k[1] for k in kernels):.0f} launches)")
        lines += [f"    {us:9.1f} us  x{count:.0f}  {kernel[:110]}" for kernel, count, us in kernels[:8]]
        print("\n".join(lines[-1 - min(len(kernels), 8):]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "profile_cuda.txt"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
