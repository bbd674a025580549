"""matmul_q against torch's float32 matmul on the same weights dequantized.

    python bench/bench_matmul_q.py [--repeats 20] [--targets AVX3,AVX2]

A 4096 x 4096 weight in Q4_0 and Q8_0 against 1 and 32 activation rows: median time of each,
GFLOP/s (2 m n k flops), weight GB/s (bytes of the weight as each side reads it) and the ratio
torch time / opforge time (> 1: opforge faster). One line per pinned SIMD target (AVX3 runs
the VNNI kernel, AVX2 pmaddubsw, SSE4 and SCALAR the portable loop). Writes
bench/results/matmul_q_cpu.csv and .png.
"""

import argparse

import numpy as np
import torch

import common
import opforge

QUANTIZE = {"q4_0": opforge.quantize_q4_0, "q8_0": opforge.quantize_q8_0}


def median_seconds(fn, repeats):
    return common.median_seconds(fn, repeats=repeats, warmup=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--targets", default="AVX3,AVX2")
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--k", type=int, default=4096)
    args = parser.parse_args()
    torch.set_num_threads(opforge.num_threads())
    rng = np.random.default_rng(0)
    n, k = args.n, args.k
    print(f"opforge {opforge.__version__}, {opforge.num_threads()} threads (torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads); weight {n} x {k}")
    print(f"{'format':<6} {'rows':>4} {'target':<7} {'opforge ms':>10} {'GFLOP/s':>8} {'GB/s':>6} "
          f"{'torch ms':>9} {'GFLOP/s':>8} {'GB/s':>6} {'ratio':>6}")
    rows = []
    for fmt, quantize in QUANTIZE.items():
        w = quantize(rng.standard_normal((n, k)).astype(np.float32))
        w_torch = torch.from_numpy(opforge.dequantize(w, fmt))
        for m in (1, 32):
            x = rng.standard_normal((m, k)).astype(np.float32)
            x_torch = torch.from_numpy(x)
            flops = 2.0 * m * n * k
            theirs = median_seconds(lambda: torch.nn.functional.linear(x_torch, w_torch), args.repeats)
            for target in args.targets.split(","):
                if target not in opforge.simd_targets():
                    continue
                opforge.set_simd_target(target)
                ours = median_seconds(lambda: opforge.matmul_q(x, w, fmt), args.repeats)
                opforge.set_simd_target("")
                print(f"{fmt:<6} {m:>4} {target:<7} {ours * 1e3:>10.3f} {flops / ours / 1e9:>8.1f} "
                      f"{w.nbytes / ours / 1e9:>6.1f} {theirs * 1e3:>9.3f} {flops / theirs / 1e9:>8.1f} "
                      f"{w_torch.numel() * 4 / theirs / 1e9:>6.1f} {theirs / ours:>5.2f}x")
                rows.append({"format": fmt, "rows": m, "target": target, "opforge_ms": ours * 1e3,
                             "opforge_GFLOP_per_s": flops / ours / 1e9, "opforge_weight_GB_per_s": w.nbytes / ours / 1e9,
                             "torch_f32_ms": theirs * 1e3, "torch_GFLOP_per_s": flops / theirs / 1e9,
                             "torch_weight_GB_per_s": w_torch.numel() * 4 / theirs / 1e9, "speedup": theirs / ours})
    print(f"\nwrote {common.write_csv('matmul_q_cpu', rows)}")
    groups = [f"{r['format']} m={r['rows']} {r['target']}" for r in rows]
    series = {"opforge matmul_q": [r["opforge_GFLOP_per_s"] for r in rows],
              "torch float32 (dequantized)": [r["torch_GFLOP_per_s"] for r in rows]}
    print(f"wrote {common.bar_plot('matmul_q_cpu', f'matmul_q vs torch float32, {n}x{k} weight', groups, series, 'GFLOP/s')}")


if __name__ == "__main__":
    main()
