"""Hardware counters (Nsight Compute) of the kernels behind the open questions in
bench/results/ops_cuda.md: the norms beside torch.compile's kernels for them (2-5% behind), and
bench/profile_gpu.py's cases (scatter_add at 28% of the copy, the quantizer, matmul_q). Per kernel:
time, DRAM bytes and throughput, achieved occupancy, registers, global-load sectors per
request (16-byte pieces of whole lines: ~4; scattered 2-byte loads: far more), and the share of
the warps' time stalled on memory, barriers, the load/store queue and the final drain.

    python bench/ncu_kernels.py [--out bench/results]     # runs ncu on this script's --run mode

Writes ncu's own CSV (ncu_kernels.csv) and prints a table of it. Every workload is warmed up first
(torch.compile's tuning included); ncu profiles only the one measured call of each (between
cudaProfilerStart and cudaProfilerStop), with the clocks left alone (--clock-control none). Where
ncu is missing or cannot read the counters, it says so and exits 0: the other GPU checks do not
depend on it. --run --dry-run runs the workloads on the CPU at toy sizes (for its test).
"""

import argparse
import csv
import io
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

METRICS = [
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "launch__grid_size",
    "launch__block_size",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    # Where the warps wait (% of active warps' cycles): on global memory, at a barrier (the row
    # kernels' block sums), for the load/store queue, for their stores to drain at exit.
    "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct",
    "smsp__warp_issue_stalled_barrier_per_warp_active.pct",
    "smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct",
    "smsp__warp_issue_stalled_drain_per_warp_active.pct",
]
STALLS = [("mem", "long_scoreboard"), ("bar", "barrier"), ("lsq", "lg_throttle"), ("drain", "drain")]


def workloads(torch, opforge, device, small):
    """(label, fn): one call each, on inputs made once: the norms beside torch.compile's, then
    profile_gpu.py's cases."""
    from profile_gpu import cases  # beside this script

    rng = np.random.default_rng(0)
    rows, cols = (64, 256) if small else (16384, 4096)
    x, weight, bias = (torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(device)
                       for shape in ((rows, cols), (cols,), (cols,)))
    ops = torch.ops.opforge
    compiled_rms = torch.compile(lambda x, w: torch.nn.functional.rms_norm(x, (cols,), w, 1e-6), dynamic=False)
    compiled_ln = torch.compile(lambda x, w, b: torch.nn.functional.layer_norm(x, (cols,), w, b, 1e-5), dynamic=False)
    yield "opforge rms_norm", lambda: ops.rms_norm(x, weight, 1e-6)
    yield "torch.compile rms_norm", lambda: compiled_rms(x, weight)
    yield "opforge layer_norm", lambda: ops.layer_norm(x, weight, bias, 1e-5)
    yield "torch.compile layer_norm", lambda: compiled_ln(x, weight, bias)
    for label, fn in cases(torch, opforge, device, small):
        yield f"opforge {label}", fn


def run(dry_run):
    """The profiled program: every workload warmed up, then one call each between the profiler's
    start and stop."""
    import torch

    import opforge
    import opforge.torch  # noqa: F401  (torch.ops.opforge)

    device = "cpu" if dry_run else "cuda"
    calls = list(workloads(torch, opforge, device, dry_run))
    for _, fn in calls:
        for _ in range(3):
            fn()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    for label, fn in calls:
        if device == "cuda":
            torch.cuda.nvtx.range_push(label)
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
        print(f"ran {label}", flush=True)
    if device == "cuda":
        torch.cuda.profiler.stop()
    return 0


def csv_lines(raw):
    """ncu's CSV lines out of its stdout, which the profiled program's prints and ncu's ==PROF==
    notes share."""
    return [l for l in raw.splitlines() if l.startswith('"')]


def range_label(cell):
    """The NVTX range's message from ncu's cell for it ('4413  "<default domain>:opforge rms_norm:none:...'):
    "opforge rms_norm"."""
    text = cell.split(">:", 1)[-1]
    return text.split(":none", 1)[0].strip().strip('"')


def table(raw_csv):
    """ncu's --csv --page raw output as rows of (range label, kernel, {metric: value}); [] if unreadable."""
    lines = csv_lines(raw_csv)
    if not lines:
        return []
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    out = []
    for r in rows:
        name = r.get("Kernel Name") or r.get("Function Name") or ""
        if not name or r.get("ID", "") == "":  # the units row
            continue
        nvtx = r.get("thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg", "") or r.get("NVTX", "")
        out.append((range_label(nvtx) if nvtx else "", name, {m: r.get(m, "") for m in METRICS}))
    return out


def print_table(rows):
    """table()'s rows, one line each."""
    print(f"{'call: kernel':<60} {'us':>8} {'DRAM GB/s':>10} {'DRAM %':>7} {'SM %':>6} {'occ %':>6} {'regs':>5} "
          f"{'sectors/req':>11} " + " ".join(f"{label + ' %':>7}" for label, _ in STALLS))
    for nvtx, name, m in rows:
        def num(key):
            try:
                return float(str(m[key]).replace(",", ""))
            except ValueError:
                return float("nan")

        us = num("gpu__time_duration.sum") / 1e3  # ns
        gbs = (num("dram__bytes_read.sum") + num("dram__bytes_write.sum")) / max(us * 1e3, 1e-9)
        sectors = num("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum") / max(
            num("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"), 1.0)
        print(f"{(nvtx + ': ' if nvtx else '') + name:<60.60} {us:8.1f} {gbs:10.0f} "
              f"{num('dram__throughput.avg.pct_of_peak_sustained_elapsed'):7.1f} "
              f"{num('sm__throughput.avg.pct_of_peak_sustained_elapsed'):6.1f} "
              f"{num('sm__warps_active.avg.pct_of_peak_sustained_active'):6.1f} "
              f"{num('launch__registers_per_thread'):5.0f} {sectors:11.1f} "
              + " ".join(f"{num(f'smsp__warp_issue_stalled_{stall}_per_warp_active.pct'):7.1f}" for _, stall in STALLS))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="store_true", help="be the profiled program")
    parser.add_argument("--dry-run", action="store_true", help="with --run: the CPU at toy sizes")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    if args.run:
        return run(args.dry_run)
    ncu = shutil.which("ncu") or next((p for p in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu")
                                       if Path(p).exists()), None)
    if not ncu:
        print("ncu_kernels.py: Nsight Compute (ncu) not found; no counters read")
        return 0
    command = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--nvtx", "--csv", "--page", "raw",
               "--print-units", "base", "--metrics", ",".join(METRICS), sys.executable, __file__, "--run"]
    print(" ".join(command), flush=True)
    proc = subprocess.run(command, capture_output=True, text=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "ncu_kernels.csv"
    path.write_text("".join(line + "\n" for line in csv_lines(proc.stdout)))
    rows = table(proc.stdout)
    if proc.returncode != 0 or not rows:
        print(f"ncu_kernels.py: ncu exited {proc.returncode} with {len(rows)} kernels read; its output:")
        print(proc.stdout[-4000:], proc.stderr[-4000:])
        return 0 if not rows else 1
    print_table(rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
