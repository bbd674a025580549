"""matmul_q against ggml's own CPU product and torch's float32 matmul on the weights dequantized.

    python bench/bench_matmul_q.py [--rows 1,2,32] [--targets AVX3,AVX2] [--rounds 3]
    python bench/bench_matmul_q.py --n 32768 --rows 1,2,3,4 --results matmul_q_cpu_dram --no-quantizers

A 4096 x 4096 weight in Q4_0 and Q8_0 against 1, 2 (decoding) and 32 activation rows (a
prompt): median time of each, GFLOP/s (2 m n k flops), weight GB/s (bytes of the weight as each
side reads it, also as a fraction of the memory's read bandwidth measured in the same rounds)
and the ratios their time / opforge's (> 1: opforge faster). Then the quantizers
and dequantize on the same matrix against ggml's (bench/results/quantizers_vs_ggml_cpu.csv). opforge runs once
per pinned SIMD target (AVX3: the AVX-512 VNNI kernels; AVX2: AVX-VNNI's 256-bit ones where the
CPU has them, as Intel's cores since Alder Lake and Zen 5 do, else pmaddubsw; the script says
which). ggml is the library opforge.ggml_cpu finds (pywhispercpp's wheel: ggml 0.13 built for
AVX2, so the AVX2 lines compare like with like where they run pmaddubsw;
OPFORGE_GGML_LIB_DIR=<dir> to time a build of your own) on the same
number of threads, its graph built once as llama.cpp does. Every implementation is timed
`--rounds` times, interleaved; medians over rounds. Writes bench/results/matmul_q_cpu.csv
and .png (`--results NAME`: NAME.csv and .png). The default weight (4096 x 4096: 9-18 MB) stays
in a large L3 between calls; decoding a model reads weights larger than the caches, which the
second line above measures (4096 x 32768: 75-143 MB).
"""

import argparse
import statistics

import numpy as np
import torch

import common
import opforge
from opforge import ggml_cpu

QUANTIZE = {"q4_0": opforge.quantize_q4_0, "q8_0": opforge.quantize_q8_0}


def avx_vnni():
    """Whether this CPU has AVX-VNNI (Linux's flag), which opforge's AVX2 target then uses."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx_vnni" in line for line in f)
    except OSError:
        return False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", default="1,2,32")
    parser.add_argument("--targets", default="AVX3,AVX2")
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--results", default="matmul_q_cpu", help="name of the CSV and PNG under bench/results")
    parser.add_argument("--no-quantizers", action="store_true", help="time only the products")
    args = parser.parse_args()
    threads = opforge.num_threads()
    torch.set_num_threads(threads)
    targets = [t for t in args.targets.split(",") if t in opforge.simd_targets()]
    ggml = ggml_cpu.load()
    rng = np.random.default_rng(0)
    n, k = args.n, args.k
    print(f"{common.machine()}; opforge {opforge.__version__} ({opforge.simd_target()}), torch {torch.__version__}, "
          f"{threads} threads each; weight {n} x {k}")
    print(f"ggml: {ggml.path} ({', '.join(ggml.features) or 'no AVX2'})" if ggml else "ggml: not found (pip install pywhispercpp)")
    print(f"opforge's AVX2 target runs {'AVX-VNNI' if avx_vnni() else 'pmaddubsw'} here")
    cases = []  # (format, rows, weight bytes, {name: callable})
    for fmt, quantize in QUANTIZE.items():
        w = quantize(rng.standard_normal((n, k)).astype(np.float32))
        w_torch = torch.from_numpy(opforge.dequantize(w, fmt))
        for m in map(int, args.rows.split(",")):
            x = rng.standard_normal((m, k)).astype(np.float32)
            x_torch = torch.from_numpy(x)
            impls = {f"opforge {t}": lambda x=x, w=w, fmt=fmt: opforge.matmul_q(x, w, fmt) for t in targets}
            impls["torch float32"] = lambda x=x_torch, w=w_torch: torch.nn.functional.linear(x, w)
            if ggml:
                mm = ggml.matmul(w, fmt, m, threads)
                mm(x)
                impls["ggml"] = mm
            cases.append((fmt, m, w.nbytes, impls))
    read = common.ReadBandwidth()
    times = {}
    for _ in range(args.rounds):
        read()
        for fmt, m, _, impls in cases:
            for name, fn in impls.items():
                # "opforge AVX2": the SIMD target pinned for the whole timing (AVX3 -> VNNI kernels).
                opforge.set_simd_target(name.split()[1] if name.startswith("opforge") else "")
                times.setdefault((fmt, m, name), []).append(common.median_seconds(fn, repeats=args.repeats))
            opforge.set_simd_target("")
    print(read.line())
    rows = report(cases, times, n, k, read.median)
    print(f"\nwrote {common.write_csv(args.results, rows)}")
    if ggml and not args.no_quantizers:
        quantizer_rows = bench_quantizers(ggml, rng, n, k, args)
        print(f"wrote {common.write_csv('quantizers_vs_ggml_cpu', quantizer_rows)}")
    groups = list(dict.fromkeys(f"{r['format']} m={r['rows']}" for r in rows))
    series = {name: [next(r["GFLOP_per_s"] for r in rows if f"{r['format']} m={r['rows']}" == g and r["impl"] == name)
                     for g in groups] for name in dict.fromkeys(r["impl"] for r in rows)}
    print(f"wrote {common.bar_plot(args.results, f'matmul_q vs ggml and torch float32, {n}x{k} weight', groups, series, 'GFLOP/s')}")


def bench_quantizers(ggml, rng, n, k, args):
    """quantize_q8_0, quantize_q4_0 and dequantize of an n x k float32 matrix: opforge on all its
    threads and on one, ggml's ggml_quantize_chunk and to_float (one thread: llama.cpp's quantize
    tool splits rows across threads itself). GB/s of float32 read or written."""
    x = rng.standard_normal((n, k)).astype(np.float32)
    threads = opforge.num_threads()
    cases = {}
    for fmt, quantize in QUANTIZE.items():
        q = quantize(x)
        cases[f"quantize_{fmt}"] = {"opforge": lambda f=quantize: f(x), "ggml": lambda fmt=fmt: ggml.quantize(x, fmt)}
        cases[f"dequantize {fmt}"] = {"opforge": lambda q=q, fmt=fmt: opforge.dequantize(q, fmt),
                                      "ggml": lambda q=q, fmt=fmt: ggml.dequantize(q, fmt)}
    times = {}
    for _ in range(args.rounds):
        for op, impls in cases.items():
            for name, fn in impls.items():
                for t in ([threads, 1] if name == "opforge" else [1]):
                    opforge.set_num_threads(t)
                    times.setdefault((op, name, t), []).append(common.median_seconds(fn, repeats=args.repeats))
                opforge.set_num_threads(threads)
    print(f"\n{'op':<18} {'impl':<8} {'threads':>7} {'ms':>8} {'GB/s':>7} {'ggml / opforge':>15}")
    rows = []
    for op in cases:
        theirs = statistics.median(times[(op, "ggml", 1)])
        for (o, name, t), ts in times.items():
            if o != op:
                continue
            med = statistics.median(ts)
            ratio = "" if name == "ggml" else f"{theirs / med:.2f}x"
            print(f"{op:<18} {name:<8} {t:>7} {med * 1e3:>8.2f} {x.nbytes / med / 1e9:>7.1f} {ratio:>15}")
            rows.append({"op": op, "impl": name, "threads": t, "ms": med * 1e3, "float32_GB_per_s": x.nbytes / med / 1e9,
                         "ggml_over_opforge": theirs / med if name != "ggml" else 1.0})
    return rows


def report(cases, times, n, k, read):
    print(f"\n{'format':<6} {'rows':>4} {'impl':<14} {'ms':>8} {'GFLOP/s':>8} {'weight GB/s':>11} {'of read':>7} "
          f"{'vs opforge AVX3':>15} {'vs opforge AVX2':>15}")
    rows = []
    for fmt, m, weight_bytes, impls in cases:
        med = {name: statistics.median(times[(fmt, m, name)]) for name in impls}
        for name, t in med.items():
            # torch reads the weight as float32; the others read the quantized blocks.
            weight = n * k * 4 if name.startswith("torch") else weight_bytes
            vs = {tgt: med[f"opforge {tgt}"] for tgt in ("AVX3", "AVX2") if f"opforge {tgt}" in med}
            ratios = {f"vs_opforge_{tgt}": t / ours for tgt, ours in vs.items()}
            gbs = weight / t / 1e9
            print(f"{fmt:<6} {m:>4} {name:<14} {t * 1e3:>8.3f} {2 * m * n * k / t / 1e9:>8.1f} {gbs:>11.1f} "
                  f"{gbs / read:>7.0%} " + " ".join(f"{r:>14.2f}x" for r in ratios.values()))
            rows.append({"format": fmt, "rows": m, "impl": name, "ms": t * 1e3, "GFLOP_per_s": 2 * m * n * k / t / 1e9,
                         "weight_GB_per_s": gbs, "fraction_of_read_bandwidth": gbs / read, **ratios})
    return rows


if __name__ == "__main__":
    main()
