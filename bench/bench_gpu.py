"""Every op on the GPU against torch eager, torch.compile, jax.jit and the measured copy bandwidth.

    python bench/bench_gpu.py [--ops rms_norm,softmax] [--mib 256] [--repeats 50] [--no-compile]
                              [--no-jax] [--out DIR]

For each op with a reference (ops/<name>/reference.py), in float32 at 4096 columns and enough
rows for --mib MiB per full-size input, plus matmul_q (4096 x 4096 Q4_0 / Q8_0 weights against 1,
32 and 512 activation rows, vs torch's float32 and float16 matmul of the dequantized weights, and
vs itself replayed from a CUDA graph: below 1x, the host's launch cost is what sets its time):
median time, GB/s (bytes read + written once, from the actual arrays), % of the device-to-device
copy bandwidth measured in the same run (torch copy_, counting read + write), and opforge's
speedup over each competitor (their time / ours); the ggml formats' ops, whose references are
NumPy on the host (FRAMEWORK_NATIVE = False), against the copy bandwidth alone. linear_act is compute-bound: TFLOP/s and % of
torch.mm's float32 rate measured in the same run instead; it runs through cuBLASLt where that
loads, and again with cuBLASLt off ("opforge own": opforge's own tiled kernels); then once more
in bfloat16 (tensor cores) against torch.mm's bfloat16 rate.

opforge runs through torch.ops.opforge on CUDA tensors, on torch's current stream. torch
implementations are timed with CUDA events around one pass over the rotated inputs (median of
--repeats passes, divided by the calls per pass); jax.jit,
which runs on XLA's own stream, by wall clock over 10 back-to-back calls ended by one
block_until_ready (dispatch overlaps the GPU work, as in real use), median of --repeats / 5.
Inputs rotate among copies whose total is at least 3x the L2 cache, so no call finds its
inputs in L2. Writes ops_cuda.csv (after each op, so an interrupted run keeps what it measured),
ops_cuda.md and ops_cuda.png (with matplotlib) into --out (default bench/results). Without a
CUDA device it says so and exits 0. --dry-run runs the whole harness on the CPU at toy sizes,
timed by the wall clock (tests/python/test_bench_gpu.py: the script's own code, checked where no
GPU is; none of its numbers mean anything).
"""

from __future__ import annotations

import argparse
import csv
import importlib
import importlib.util
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

COLS = 4096  # the reference ops' columns
QUANT_N = 4096  # matmul_q's weights: QUANT_N x QUANT_N
MATMUL_N = 8192  # torch.mm's rate, the linear_act limit
DEVICE = "cuda"  # "cpu" for --dry-run, with the sizes above cut down
# The issue's targets (norms, softmax, elementwise, ...), measured first so a --budget-s cut drops
# the rest.
ISSUE_OPS = ["rms_norm", "layer_norm", "softmax", "add", "mul", "silu", "gelu", "relu", "rope", "scatter_add",
             "linear_act"]
START = time.monotonic()
FIELDS = ["op", "shape", "impl", "median_us", "rate", "unit", "pct_of_limit", "opforge_speedup"]


class Float32Rng:
    """The references' samples draw float64; at GPU sizes that is seconds of host time per input.
    This draws the same distribution straight in float32."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def standard_normal(self, size=None):
        return self.rng.standard_normal(size, dtype=np.float32)

    def __getattr__(self, name):
        return getattr(self.rng, name)


def cuda_events_median(fn, arg_sets, repeats, warmup=3):
    """Median milliseconds per call of fn(*args), each sample one pass over the argument sets
    between two CUDA events on the current stream. A pass of several calls keeps the GPU queue
    full, so a kernel shorter than the host's dispatch is timed as the kernel, not the dispatch.
    (--dry-run: the wall clock around each pass.)"""
    import torch

    for i in range(warmup):
        fn(*arg_sets[i % len(arg_sets)])
    if DEVICE == "cpu":
        passes = []
        for _ in range(repeats):
            start = time.perf_counter()
            for args in arg_sets:
                fn(*args)
            passes.append((time.perf_counter() - start) * 1e3)
        return statistics.median(passes) / len(arg_sets)
    pairs = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for args in arg_sets:
            fn(*args)
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs) / len(arg_sets)


def graph_pass(fn, arg_sets):
    """One pass of fn over arg_sets captured in a CUDA graph, as a function of no arguments that
    replays it: the device's time for the pass without the host's cost per call (warmed up on a side
    stream first, as torch's CUDA graph docs ask)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for args in arg_sets:
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args in arg_sets:
            fn(*args)
    return graph.replay


def jax_median(fn, arg_sets, repeats, inner=10):
    """Median milliseconds per call of `inner` back-to-back calls ended by one block_until_ready."""
    out = None
    for i in range(3):
        out = fn(*arg_sets[i % len(arg_sets)])
    out.block_until_ready()
    times = []
    for _ in range(max(3, repeats // 5)):
        start = time.perf_counter()
        for i in range(inner):
            out = fn(*arg_sets[i % len(arg_sets)])
        out.block_until_ready()
        times.append((time.perf_counter() - start) / inner * 1e3)
    return statistics.median(times)


def copies_for(nbytes, l2_bytes):
    """How many copies of an input set keep the rotation's total past 3x the L2 cache."""
    return max(2, min(64, math.ceil(3 * l2_bytes / max(1, nbytes))))


def copy_bandwidth(nbytes, repeats):
    """Device-to-device copy (torch copy_) in GB/s, counting bytes read + written."""
    import torch

    n = nbytes // 4
    a, b = torch.empty(n, device=DEVICE).normal_(), torch.empty(n, device=DEVICE)
    ms = cuda_events_median(lambda: b.copy_(a), [()], repeats)
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def matmul_rate(repeats, dtype="float32"):
    """torch.mm TFLOP/s in `dtype` (float32: TF32 as torch is configured, off by default)."""
    import torch

    n = MATMUL_N
    a, b = (torch.randn(n, n, device=DEVICE, dtype=getattr(torch, dtype)) for _ in range(2))
    ms = cuda_events_median(torch.mm, [(a, b)], max(5, repeats // 5))
    return 2 * n**3 / (ms * 1e-3) / 1e12


def implementations(name, ref, attrs, compile_torch, use_jax):
    """impl -> (callable, "torch" | "jax")."""
    import torch

    import opforge

    def ours(*a):
        return getattr(torch.ops.opforge, name)(*a, **attrs)

    def with_setting(setter, value):  # ours with a process-wide opforge switch turned for the call
        def call(*a):
            before = setter(value)
            try:
                return ours(*a)
            finally:
                setter(before)
        return call

    impls = {"opforge": (ours, "torch")}
    if name == "linear_act" and opforge._core.cublaslt_status().startswith("cuBLASLt"):
        impls["opforge own"] = (with_setting(opforge._core.set_cublaslt, False), "torch")  # its own tiled kernels
    if not getattr(ref, "FRAMEWORK_NATIVE", True):  # its "torch" and "jax" are NumPy on the host: no competitors
        return impls
    if hasattr(ref, "torch"):
        impls["torch eager"] = (lambda *a: ref.torch(*a, **attrs), "torch")
        if compile_torch:
            torch._dynamo.reset()  # one code object for every op: keep clear of the recompile limit
            impls["torch.compile"] = (torch.compile(lambda *a: ref.torch(*a, **attrs), dynamic=False), "torch")
    if use_jax and hasattr(ref, "jax"):
        import jax

        # XLA's default matmul precision on an H100 is TF32; torch's (and opforge's) is float32.
        jax.config.update("jax_default_matmul_precision", "highest")
        impls["jax.jit"] = (jax.jit(lambda *a: ref.jax(*a, **attrs)), "jax")
    return impls


class Results:
    """Rows, written to CSV after every op, so a run cut short keeps what it measured."""

    def __init__(self, out_dir: Path, header=None, title="", copy_gbs=0.0):
        """With a header (markdown lines), ops_cuda.md and ops_cuda.png are rewritten after every op
        too: a run cut short (the GPU machine's time limit) keeps all three tables."""
        self.out_dir, self.rows = out_dir, []
        self.header, self.title, self.copy_gbs = header, title, copy_gbs
        out_dir.mkdir(parents=True, exist_ok=True)

    def add(self, op, shape, times, unit, amount, limit):
        """times: impl -> ms; amount: bytes (GB/s) or flops (TFLOP/s); limit: the rate to compare."""
        scale = 1e9 if unit == "GB/s" else 1e12
        for impl, ms in times.items():
            rate = amount / (ms * 1e-3) / scale
            # significant digits, not decimals: a dry run's toy rates (well under 0.01 GB/s on a busy
            # machine) must not print as 0
            row = {"op": op, "shape": shape, "impl": impl, "median_us": round(ms * 1e3, 2), "rate": float(f"{rate:.4g}"),
                   "unit": unit, "pct_of_limit": round(100 * rate / limit, 1) if limit else "",
                   "opforge_speedup": float(f"{ms / times['opforge']:.4g}")}
            self.rows.append(row)
            speed = "" if impl == "opforge" else f"{row['opforge_speedup']:.2f}x"
            pct = f"{row['pct_of_limit']:.0f}%" if limit else ""
            print(f"{op:<14} {shape:<22} {impl:<14} {row['median_us']:>10.1f} {rate:>9.1f} {unit:<8} {pct:>6} {speed:>9}",
                  flush=True)
        with open(self.out_dir / "ops_cuda.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(self.rows)
        if self.header is not None:
            self.markdown(self.header)
            self.plot(self.title, self.copy_gbs)

    def markdown(self, header):
        impls = list(dict.fromkeys(r["impl"] for r in self.rows))
        lines = header + ["", "| op | shape | opforge | % of limit | " + " | ".join(
            f"vs {i}" for i in impls if i != "opforge") + " |", "|" + " --- |" * (3 + len(impls))]
        for op, shape in dict.fromkeys((r["op"], r["shape"]) for r in self.rows):
            by = {r["impl"]: r for r in self.rows if r["op"] == op and r["shape"] == shape}
            if "opforge" not in by:
                continue
            ours = by["opforge"]
            cells = [f"{by[i]['opforge_speedup']:.2f}x" if i in by else "" for i in impls if i != "opforge"]
            pct = f"{ours['pct_of_limit']:.0f}%" if ours["pct_of_limit"] != "" else ""
            lines.append(f"| {op} | {shape} | {ours['rate']:.1f} {ours['unit']} | {pct} | " + " | ".join(cells) + " |")
        lines += ["", "vs X: X's time / opforge's time (above 1: opforge is faster)."]
        path = self.out_dir / "ops_cuda.md"
        path.write_text("\n".join(lines) + "\n")
        return path

    def plot(self, title, copy_gbs):
        """ops_cuda.png: GB/s per op and implementation against the copy bandwidth (bandwidth rows only)."""
        if importlib.util.find_spec("matplotlib") is None:
            return "no PNG (matplotlib is not installed)"
        import common

        rows = [r for r in self.rows if r["unit"] == "GB/s"]
        groups = list(dict.fromkeys(f"{r['op']} {r['shape']}" if r["op"] == "matmul_q" else r["op"] for r in rows))
        impls = list(dict.fromkeys(r["impl"] for r in rows))
        rate = {(f"{r['op']} {r['shape']}" if r["op"] == "matmul_q" else r["op"], r["impl"]): r["rate"] for r in rows}
        series = {i: [rate.get((g, i), 0.0) for g in groups] for i in impls}
        return common.bar_plot("ops_cuda", title, groups, series, "GB/s", copy_gbs, "device copy", self.out_dir)


def out_of_time(args, what):
    if args.budget_s is not None and time.monotonic() - START > args.budget_s:
        print(f"bench_gpu.py: --budget-s {args.budget_s:.0f} spent; skipping {what}", flush=True)
        return True
    return False


def to_jax(t):
    """A CUDA torch tensor as a JAX GPU array (bfloat16 through float32: NumPy has no bfloat16)."""
    import jax
    import jax.numpy as jnp
    import torch

    device = jax.devices("gpu" if DEVICE == "cuda" else "cpu")[0]
    if t.dtype == torch.bfloat16:
        return jax.device_put(jnp.asarray(t.float().cpu().numpy(), dtype=jnp.bfloat16), device)
    return jax.device_put(t.cpu().numpy(), device)


def bench_reference_ops(ops, args, results, copy_gbs, mm_tflops, l2_bytes, dtype="float32", transposed=False):
    """transposed: x (the first input) laid out as x.T is, its rows side by side (the row ops'
    panel kernels); jax arrays have no such layout, so jax.jit sits those out."""
    import torch

    rows = max(1, args.mib * (1 << 20) // (4 * COLS))
    for name in ops:
        label = (name if dtype == "float32" else f"{name} {dtype}") + (" x.T" if transposed else "")
        if out_of_time(args, label):
            continue
        ref = importlib.import_module(f"opforge.references.{name}")
        arrays, attrs = ref.sample(Float32Rng(0), rows=rows, cols=COLS)
        # float data in `dtype`; integer inputs (scatter_add's index) keep their dtype
        base = [torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32 if np.issubdtype(a.dtype, np.floating)
                                                      else a.dtype)).to(DEVICE) for a in map(np.asarray, arrays)]
        base = [t.to(getattr(torch, dtype)) if t.is_floating_point() else t for t in base]
        if transposed:
            base[0] = base[0].T.contiguous().T  # the same values, column-major
        try:
            out = getattr(torch.ops.opforge, name)(*base, **attrs)
        except Exception as error:  # one op failing must not cost the others their rows
            print(f"{label}: opforge failed: {type(error).__name__}: {str(error)[:300]}", flush=True)
            continue
        set_bytes = sum(t.numel() * t.element_size() for t in base)
        nbytes = set_bytes + out.numel() * out.element_size()
        sets = [base] + [[t.clone() for t in base] for _ in range(copies_for(set_bytes, l2_bytes) - 1)]
        impls = implementations(name, ref, attrs, not args.no_compile, not args.no_jax and not transposed)
        times = {}
        for impl, (fn, kind) in impls.items():
            try:
                if kind == "jax":
                    import jax

                    jsets = [[to_jax(t) for t in s] for s in sets]
                    times[impl] = jax_median(fn, jsets, args.repeats)
                    del jsets
                else:
                    times[impl] = cuda_events_median(fn, sets, args.repeats)
            except Exception as error:  # a competitor failing (say, no jax GPU) is reported, not fatal
                print(f"{label}: {impl} failed: {type(error).__name__}: {str(error)[:200]}", flush=True)
        shape = "x".join(map(str, base[0].shape))
        if "opforge" not in times:
            continue
        if hasattr(ref, "flops"):
            shapes_only = [np.broadcast_to(np.float32(0), tuple(t.shape)) for t in base[:2]]  # flops() reads shapes
            results.add(label, shape, times, "TFLOP/s", ref.flops(shapes_only), mm_tflops)
        else:
            results.add(label, shape, times, "GB/s", nbytes, copy_gbs)
        del sets, base, out
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


def bench_matmul_q(args, results, copy_gbs, l2_bytes):
    """matmul_q moves 4-8x fewer weight bytes than a float32 matmul of the dequantized weights."""
    import torch

    import opforge

    rng = np.random.default_rng(0)
    n = k = QUANT_N
    for fmt in ("q4_0", "q8_0"):
        if out_of_time(args, f"matmul_q {fmt}"):
            continue
        w = torch.from_numpy(getattr(opforge, f"quantize_{fmt}")(rng.standard_normal((n, k), dtype=np.float32)))
        w = w.to(DEVICE)
        w32 = torch.ops.opforge.dequantize(w, fmt)
        w16 = w32.half()
        for m in (1, 32, 512):  # a token, a small batch, a prompt
            x = torch.from_numpy(rng.standard_normal((m, k), dtype=np.float32)).to(DEVICE)
            copies = copies_for(w.numel(), l2_bytes)  # weights dominate: rotate those
            ws = [w] + [w.clone() for _ in range(copies - 1)]
            w32s = [w32] + [w32.clone() for _ in range(copies_for(w32.numel() * 4, l2_bytes) - 1)]
            w16s = [w16] + [w16.clone() for _ in range(copies_for(w16.numel() * 2, l2_bytes) - 1)]
            candidates = {
                "opforge": (lambda wq: torch.ops.opforge.matmul_q(x, wq, fmt), ws),
                "torch f32 dequantized": (lambda wd: x @ wd.T, w32s),
                "torch f16 dequantized": (lambda wd: x.half() @ wd.T, w16s),
            }
            times = {}
            for impl, (fn, weights) in candidates.items():
                try:
                    times[impl] = cuda_events_median(fn, [(t,) for t in weights], args.repeats)
                    if impl == "opforge" and DEVICE == "cuda":
                        # The same pass replayed from a CUDA graph: where it is much faster, the
                        # host's launches, not the kernels, set opforge's time at this size.
                        replay = graph_pass(fn, [(t,) for t in weights])
                        times["opforge in a CUDA graph"] = cuda_events_median(replay, [()], args.repeats) / len(weights)
                except Exception as error:
                    print(f"matmul_q {fmt} m={m}: {impl} failed: {type(error).__name__}: {str(error)[:300]}", flush=True)
            if "opforge" not in times:
                continue
            nbytes = w.numel() + x.numel() * 4 + m * n * 4
            results.add("matmul_q", f"{fmt} {m}x{k} @ {n}x{k}^T", times, "GB/s", nbytes, copy_gbs)
            del ws, w32s, w16s


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default=None, help="comma-separated; default: every op with a reference, and matmul_q")
    parser.add_argument("--mib", type=int, default=256, help="MiB per full-size input (default 256)")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (slow to compile)")
    parser.add_argument("--no-jax", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop starting new ops after this many seconds (the tables keep what was measured)")
    parser.add_argument("--dry-run", action="store_true",
                        help="the harness on the CPU at toy sizes (for its tests; the numbers mean nothing)")
    args = parser.parse_args(argv)
    global COLS, QUANT_N, MATMUL_N, DEVICE
    COLS, QUANT_N, MATMUL_N, DEVICE = (4096, 4096, 8192, "cuda") if not args.dry_run else (256, 256, 256, "cpu")

    try:
        import torch
    except ImportError:
        print("bench_gpu.py: torch is not installed; no CUDA device to measure")
        return 0
    if not torch.cuda.is_available() and not args.dry_run:
        print("bench_gpu.py: no CUDA device (torch.cuda.is_available() is False); nothing to measure")
        return 0
    import opforge
    import opforge.torch  # noqa: F401  (torch.ops.opforge)

    cuda = next((b for b in opforge.backends() if b["name"] == "cuda"), None)
    if not args.dry_run and (not cuda or not cuda["available"]):  # a GPU but no opforge kernels for it: a broken build
        print(f"bench_gpu.py: torch sees a GPU but opforge's CUDA backend is unavailable: "
              f"{cuda['reason'] if cuda else 'opforge was built without CUDA'}")
        return 1
    if not args.no_jax:
        try:
            import jax

            jax.devices("gpu" if DEVICE == "cuda" else "cpu")
        except Exception as error:  # jax missing or CPU-only: the table simply lacks that column
            print(f"bench_gpu.py: jax.jit left out ({type(error).__name__}: {error})")
            args.no_jax = True

    with_refs = [n for n in opforge._core.op_names()
                 if importlib.util.find_spec(f"opforge.references.{n}") and not n.endswith("_backward")]
    with_refs = [n for n in ISSUE_OPS if n in with_refs] + [n for n in with_refs if n not in ISSUE_OPS]
    ops = args.ops.split(",") if args.ops else with_refs + ["matmul_q"]
    if args.dry_run:
        name, l2_bytes = "the CPU (--dry-run: toy sizes, wall clock; not a measurement)", 1 << 20
    else:
        props = torch.cuda.get_device_properties(0)
        name, l2_bytes = props.name, getattr(props, "L2_cache_size", 50 << 20)
    copy_gbs = copy_bandwidth(args.mib << 20, args.repeats)
    mm_tflops = matmul_rate(args.repeats) if "linear_act" in ops else 0.0
    header = [f"# opforge on {name} (torch {torch.__version__})", "",
              f"Device-to-device copy (torch copy_, {args.mib} MiB, read + write): {copy_gbs:.0f} GB/s; "
              f"% of limit below is of that" + (f", or for linear_act of torch.mm float32: {mm_tflops:.1f} TFLOP/s"
                                                if mm_tflops else "") + ".",
              f"float32, {COLS} columns, {args.mib} MiB per full-size input, inputs rotated past 3x the "
              f"{l2_bytes >> 20} MiB L2; median of {args.repeats} passes over them (CUDA events; jax.jit: wall clock, "
              "see the script).", f"linear_act's product: {opforge._core.cublaslt_status()}; "
              "\"opforge own\" is opforge with cuBLASLt off (its own kernels); \"linear_act bfloat16\" "
              "is % of torch.mm's bfloat16 rate."]
    print("\n".join(header) + "\n", flush=True)
    print(f"{'op':<14} {'shape':<22} {'impl':<14} {'median µs':>10} {'rate':>9} {'unit':<8} {'% lim':>6} {'speedup':>9}")
    title = f"opforge vs competitors (float32, {name})"
    results = Results(args.out, header, title, copy_gbs)
    # The issue's ops, then matmul_q, then the rest (the quantizers' references are slow NumPy).
    main_ops = [o for o in ops if o in ISSUE_OPS]
    bench_reference_ops(main_ops, args, results, copy_gbs, mm_tflops, l2_bytes)
    if "linear_act" in ops:  # where tensor cores count: bfloat16 against torch.mm's bfloat16 rate
        bench_reference_ops(["linear_act"], args, results, copy_gbs, matmul_rate(args.repeats, dtype="bfloat16"),
                            l2_bytes, dtype="bfloat16")
    if "matmul_q" in ops:
        bench_matmul_q(args, results, copy_gbs, l2_bytes)
    bench_reference_ops([o for o in ("rms_norm", "layer_norm", "softmax") if o in ops], args, results, copy_gbs,
                        mm_tflops, l2_bytes, transposed=True)
    bench_reference_ops([o for o in ops if o not in main_ops and o != "matmul_q"], args, results, copy_gbs, mm_tflops,
                        l2_bytes)
    print(f"\nwrote {args.out / 'ops_cuda.csv'}, {results.markdown(header)} and {results.plot(title, copy_gbs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
