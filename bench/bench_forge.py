"""The forge device's costs, as ratios measured side by side in one run.

    python bench/bench_forge.py [--repeats 15] [--calls 2000]

Allocation: torch.empty of 4 KiB, 64 KiB and 4 MiB, freed at once, median µs per
allocate+free: forge's caching pool, forge with the pool off (every allocation maps fresh pages,
every free unmaps them: the system allocator), and torch's CPU allocator for comparison.

Op overhead: torch.ops.opforge.add on forge tensors (validate and allocate on the caller, queue
on the stream, the worker opens the blocks, runs opforge's CPU kernel, closes them; timed to
completion with a synchronize) against the same op on CPU tensors, at 1 element (pure overhead)
and 1 Mi elements (the kernel dominates). Under inference_mode, so both skip autograd.
Writes bench/results/forge_cpu.csv and forge_cpu.png.
"""

from __future__ import annotations

import argparse
import statistics
import time

import common


def batched_us(fn, calls: int, repeats: int, sync=lambda: None) -> float:
    """Median over `repeats` batches of µs per call (a batch amortises the timer)."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()

    import torch

    import opforge.forge as forge
    import opforge.torch  # noqa: F401

    print(f"forge device benchmark on {common.machine()}; torch {torch.__version__}; "
          f"memory protection {'on' if forge.memory_protected() else 'off'}\n")
    rows = []

    print(f"{'allocate+free':<16}{'pool µs':>10}{'no pool µs':>12}{'torch cpu µs':>14}{'no pool / pool':>16}")
    for label, n in [("4 KiB", 1024), ("64 KiB", 16384), ("4 MiB", 1 << 20)]:
        calls = args.calls if n < (1 << 20) else args.calls // 10
        times = {}
        for kind in ("pool", "no pool", "torch cpu"):
            forge.set_caching(kind != "no pool")
            device = "cpu" if kind == "torch cpu" else "forge"
            times[kind] = batched_us(lambda: torch.empty(n, device=device), calls, args.repeats)
        forge.set_caching(True)
        ratio = times["no pool"] / times["pool"]
        print(f"{label:<16}{times['pool']:>10.2f}{times['no pool']:>12.2f}{times['torch cpu']:>14.2f}{ratio:>16.2f}")
        rows.append({"benchmark": f"alloc {label}", "forge_us": round(times["pool"], 3),
                     "baseline_us": round(times["no pool"], 3), "torch_cpu_us": round(times["torch cpu"], 3),
                     "ratio": round(ratio, 3)})

    print(f"\n{'opforge.add':<16}{'forge µs':>10}{'cpu µs':>12}{'forge / cpu':>14}")
    for label, n in [("1 element", 1), ("1 Mi elements", 1 << 20)]:
        calls = args.calls if n == 1 else max(20, args.calls // 100)
        a, b = torch.rand(n), torch.rand(n)
        fa, fb = a.to("forge"), b.to("forge")
        with torch.inference_mode():
            cpu = batched_us(lambda: torch.ops.opforge.add(a, b), calls, args.repeats)
            on_forge = batched_us(lambda: torch.ops.opforge.add(fa, fb), calls, args.repeats, forge.synchronize)
        ratio = on_forge / cpu
        print(f"{label:<16}{on_forge:>10.2f}{cpu:>12.2f}{ratio:>14.2f}")
        rows.append({"benchmark": f"add {label}", "forge_us": round(on_forge, 3), "baseline_us": round(cpu, 3),
                     "torch_cpu_us": round(cpu, 3), "ratio": round(ratio, 3)})

    csv_path = common.write_csv("forge_cpu", rows)
    png = common.bar_plot("forge_cpu", "forge device: µs per call (lower is better)", [r["benchmark"] for r in rows],
                          {"forge": [r["forge_us"] for r in rows],
                           "baseline (alloc: no pool; add: cpu tensors)": [r["baseline_us"] for r in rows]},
                          "µs per call")
    print(f"\nwrote {csv_path} and {png}")


if __name__ == "__main__":
    main()
