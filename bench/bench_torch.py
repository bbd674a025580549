"""opforge's PyTorch paths against torch's own: per-call overhead and large-tensor throughput.

    python bench/bench_torch.py [--repeats 15] [--calls 2000] [--threads N]

Overhead: add on 1-element float32 tensors, median µs per call (medians over batches of calls,
the paths interleaved so machine noise hits them alike), ratio to torch.add and to the same
native op called through torch.ops (torch.ops.aten.add.Tensor, the like-for-like dispatcher
entry). Paths: torch.ops.opforge.add (the dispatcher, then opforge's C++ autograd kernel from
libopforge_torch_native, then the stable-ABI CPU kernel), opforge.torch.add (the direct call:
plain CPU tensors that need no gradient go straight to opforge's validator and kernel),
opforge.add (which hands torch tensors to opforge.torch.add), the generic DLPack call on torch
tensors (a function made without that route: what opforge.add cost before it had one), and
each under torch.inference_mode (no autograd key).

Throughput: each op with a torch reference at 4096x4096 float32 (64 MiB per input), opforge
through torch.ops.opforge against the reference in torch eager, on the same thread count: GB/s
(bytes read + written once) and opforge's speedup (torch time / opforge time).
Writes bench/results/torch_cpu.csv and torch_cpu.png (--results names others).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time

import numpy as np

import common


def overhead(repeats: int, calls: int) -> dict[str, float]:
    import torch

    import opforge
    import opforge.torch  # noqa: F401  (torch.ops.opforge)

    a, b = torch.ones(1), torch.ones(1)
    with torch.inference_mode():
        ai, bi = torch.ones(1), torch.ones(1)
    aten, ours = torch.ops.aten.add.Tensor, torch.ops.opforge.add
    generic = opforge._core.function(opforge._core.op("add"))  # no route to opforge.torch

    def inference(fn):
        def run():
            with torch.inference_mode():
                return fn(ai, bi)
        return run

    paths = {
        "torch.add": lambda: torch.add(a, b),
        "torch.ops.aten.add": lambda: aten(a, b),
        "torch.ops.opforge.add": lambda: ours(a, b),
        "opforge.torch.add": lambda: opforge.torch.add(a, b),
        "opforge.add": lambda: opforge.add(a, b),
        "generic DLPack path": lambda: generic(a, b),
        "inference_mode torch.add": inference(torch.add),
        "inference_mode torch.ops.aten.add": inference(aten),
        "inference_mode torch.ops.opforge.add": inference(ours),
        "inference_mode opforge.torch.add": inference(opforge.torch.add),
    }
    samples = {name: [] for name in paths}
    for _ in range(repeats):
        for name, fn in paths.items():
            fn()  # warm
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    # The inference_mode rows include entering the mode once per call; subtract that cost,
    # measured the same way, so they show the op call alone.
    enter = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            with torch.inference_mode():
                pass
        enter.append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(s) - (statistics.median(enter) if name.startswith("inference") else 0)
            for name, s in samples.items()}


def throughput(repeats: int) -> list[dict]:
    import torch

    import opforge

    rng = np.random.default_rng(0)
    rows = []
    for name in opforge._core.op_names():
        if importlib.util.find_spec(f"opforge.references.{name}") is None:
            continue
        ref = importlib.import_module(f"opforge.references.{name}")
        if not hasattr(ref, "torch") or not getattr(ref, "FRAMEWORK_NATIVE", True):
            continue  # no torch implementation to race (the ggml ops' references are NumPy)
        arrays, attrs = ref.sample(rng, rows=4096, cols=4096)
        args = [torch.from_numpy(a.astype(np.float32) if a.dtype == np.float64 else a) for a in arrays]
        op = getattr(torch.ops.opforge, name)
        out = op(*args, **attrs)
        outs = out if isinstance(out, tuple) else (out,)
        nbytes = sum(t.numel() * t.element_size() for t in (*args, *outs))
        t_ours = common.median_seconds(lambda: op(*args, **attrs), repeats=repeats)
        t_torch = common.median_seconds(lambda: ref.torch(*args, **attrs), repeats=repeats)
        rows.append({"op": name, "torch_gbs": nbytes / t_torch / 1e9, "opforge_gbs": nbytes / t_ours / 1e9,
                     "speedup": t_torch / t_ours, "opforge_ms": t_ours * 1e3, "torch_ms": t_torch * 1e3})
    return rows


def plot(times: dict[str, float], rows: list[dict], name: str = "torch_cpu"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    names = list(times)
    colors = ["tab:gray" if "opforge" not in n else "tab:blue" for n in names]
    left.barh(names[::-1], [times[n] for n in names[::-1]], color=colors[::-1])
    left.set_xlabel("µs per call (median), add on 1-element float32")
    left.set_title("per-call overhead")
    ops = [r["op"] for r in rows]
    x = np.arange(len(ops))
    right.bar(x - 0.2, [r["torch_gbs"] for r in rows], 0.4, label="torch eager", color="tab:gray")
    right.bar(x + 0.2, [r["opforge_gbs"] for r in rows], 0.4, label="torch.ops.opforge", color="tab:blue")
    right.set_xticks(x, ops, rotation=30, ha="right")
    right.set_ylabel("GB/s (4096x4096 float32)")
    right.set_title("throughput")
    right.legend(fontsize=8)
    fig.tight_layout()
    path = common.RESULTS / f"{name}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None):
    import torch

    import opforge

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000, help="calls per overhead sample")
    parser.add_argument("--threads", type=int, default=opforge.num_threads())
    parser.add_argument("--results", default="torch_cpu", help="name of the CSV and PNG under bench/results")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    opforge.set_num_threads(args.threads)
    print(f"machine: {common.machine()}; torch {torch.__version__}; {args.threads} threads for torch and opforge\n")

    times = overhead(args.repeats, args.calls)
    mode = lambda name: "inference_mode " if name.startswith("inference") else ""  # noqa: E731
    ratios = {name: (us / times[mode(name) + "torch.add"], us / times[mode(name) + "torch.ops.aten.add"])
              for name, us in times.items()}
    print(f"{'per-call overhead (add, 1 element)':<38} {'µs':>7} {'/ torch.add':>12} {'/ aten via torch.ops':>21}")
    for name, us in times.items():
        print(f"{name:<38} {us:>7.2f} {ratios[name][0]:>11.2f}x {ratios[name][1]:>20.2f}x")

    rows = throughput(args.repeats)
    print(f"\n{'throughput (4096x4096 float32)':<24} {'torch ms':>9} {'opforge ms':>11} {'torch GB/s':>11} "
          f"{'opforge GB/s':>13} {'speedup':>8}")
    for r in rows:
        print(f"{r['op']:<24} {r['torch_ms']:>9.2f} {r['opforge_ms']:>11.2f} {r['torch_gbs']:>11.1f} "
              f"{r['opforge_gbs']:>13.1f} {r['speedup']:>7.2f}x")

    # Overhead rows: time / torch.add's (and / torch.ops.aten.add's), in the same mode.
    # Throughput rows: opforge and torch eager GB/s, speedup = torch time / opforge time.
    csv_rows = [{"section": "overhead", "name": n, "median_us": us, "x_torch_add": ratios[n][0],
                 "x_aten_via_torch_ops": ratios[n][1], "opforge_GB_per_s": "", "torch_GB_per_s": "", "speedup": ""}
                for n, us in times.items()]
    csv_rows += [{"section": "throughput", "name": r["op"], "median_us": r["opforge_ms"] * 1e3, "x_torch_add": "",
                  "x_aten_via_torch_ops": "", "opforge_GB_per_s": r["opforge_gbs"], "torch_GB_per_s": r["torch_gbs"],
                  "speedup": r["speedup"]} for r in rows]
    print(f"\nwrote {common.write_csv(args.results, csv_rows)}")
    print(f"wrote {plot(times, rows, args.results)}")


if __name__ == "__main__":
    sys.exit(main())
