"""linear_act (x @ weight^T + bias, then exact gelu) against torch eager and jax.jit, float32 and
bfloat16, the forward alone and a training step (forward and the gradients of x, weight and
bias), side by side in one run.

    python bench/bench_linear_act.py [--shapes 64x1024x1024,1024x1024x1024,2048x2048x2048]
                                     [--dtypes float32,bfloat16] [--kinds forward,step]
                                     [--repeats 10] [--rounds 3] [--results linear_act_cpu]

Each shape is m x k x n (x [m, k], weight [n, k]). opforge runs as a torch user calls it
(`opforge.torch.linear_act`); on CPUs with AMX its bfloat16 rows are measured twice, AMX on
(the default) and off (the AVX-512 kernel), and likewise with AVX512_BF16's dot products; bfloat16 steps
also with the backward's g rounded to bfloat16 as torch's is (`opforge.set_bf16_grad_rounding_enabled`,
off by default). torch: `gelu(F.linear(x, w, b))` (oneDNN, which
uses AMX for bfloat16 where the CPU has it); jax: one jit of the same, its weight [k, n] (since
2026-11-28; earlier runs gave it torch's [n, k] and `w.T`: within 7% at the training shapes but
for the 64-row bfloat16 forward, 1.2x). A step: opforge through
`opforge.torch.linear_act` and `torch.autograd.grad`, torch eager the same way, jax one jit of
the forward and `jax.vjp`; 3 products, 6 m n k flops. Medians of `repeats`
calls, then the median over `rounds` sweeps (noise on a shared machine comes in bursts).
GFLOP/s count 2 m n k; weight GB/s the weight's bytes per call, also as a fraction of the
memory's read bandwidth measured in the same rounds (the limit where a few rows meet a weight
larger than the caches: decoding, `--shapes 1x4096x16384,4x4096x16384 --kinds forward`);
speedups are their time / ours (> 1: opforge faster). Writes bench/results/linear_act_cpu.csv
and .png (or the --results name).
"""

import argparse
import statistics

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F

import common
import opforge
import opforge.torch as ot


def implementations(x, w, b, kind):
    """{name: (zero-argument callable, sync)} for one case; opforge's AMX switch set by the caller."""
    # jax gets the weight as [k, n], its own layout (flax's Dense kernel): XLA's CPU product with a
    # transposed [n, k] weight took 100 ms for one row against 4096 x 16384, 5 ms this way.
    xj, wj, bj = (jnp.asarray(t.float().numpy()).astype(jnp.bfloat16 if t.dtype == torch.bfloat16 else jnp.float32)
                  for t in (x, w.T.contiguous(), b))
    forward = lambda x, w, b: jax.nn.gelu(x @ w + b, approximate=False)  # noqa: E731
    if kind == "forward":
        jitted = jax.jit(forward)
        return {
            "opforge": (lambda: ot.linear_act(x, w, b, act="gelu"), lambda r: r),
            "torch eager": (lambda: F.gelu(F.linear(x, w, b)), lambda r: r),
            "jax.jit": (lambda: jitted(xj, wj, bj), jax.block_until_ready),
        }
    x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
    g = torch.randn(x.shape[0], w.shape[0], dtype=x.dtype)
    gj = jnp.asarray(g.float().numpy()).astype(xj.dtype)
    step = jax.jit(lambda x, w, b, g: jax.vjp(forward, x, w, b)[1](g))
    return {
        "opforge": (lambda: torch.autograd.grad(ot.linear_act(x, w, b, act="gelu"), (x, w, b), g), lambda r: r),
        "torch eager": (lambda: torch.autograd.grad(F.gelu(F.linear(x, w, b)), (x, w, b), g), lambda r: r),
        "jax.jit": (lambda: step(xj, wj, bj, gj), jax.block_until_ready),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="64x1024x1024,1024x1024x1024,2048x2048x2048")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--kinds", default="forward,step")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", default="linear_act_cpu", help="name of the CSV and PNG under bench/results")
    args = parser.parse_args()
    torch.set_num_threads(opforge.num_threads())
    torch.manual_seed(0)
    amx, dot = opforge.amx_supported(), opforge.bf16_dot_supported()
    print(f"{common.machine()}; opforge {opforge.__version__}, {opforge.num_threads()} threads, AMX "
          f"{'supported' if amx else 'not supported'}, AVX512_BF16 {'supported' if dot else 'not supported'}; "
          f"torch {torch.__version__}, jax {jax.__version__}")
    # opforge's bfloat16 units: the best it has, then each turned off in turn (the FMA product last)
    # (AMX, AVX512_BF16 dot products, g rounded) as the environment started them
    default = (opforge.amx_enabled(), opforge.bf16_dot_enabled(), opforge.bf16_grad_rounding_enabled())
    units = [("opforge", default)]
    if amx:
        units.append(("opforge (AMX off)", (False, dot, default[2])))
    if dot:
        units.append(("opforge (AMX, AVX512_BF16 off)" if amx else "opforge (AVX512_BF16 off)",
                      (False, False, default[2])))
    rounded = ("opforge (g rounded)", default[:2] + (True,))  # bfloat16 steps only: the forward has no g
    cases = []
    for kind in args.kinds.split(","):
        for shape in args.shapes.split(","):
            m, k, n = (int(v) for v in shape.split("x"))
            for name in args.dtypes.split(","):
                dtype = getattr(torch, name)
                x = torch.randn(m, k, dtype=dtype)
                w = (torch.randn(n, k) / k**0.5).to(dtype)
                b = torch.randn(n, dtype=dtype)
                impls = implementations(x, w, b, kind)
                variants = (units + [rounded] * (kind == "step")) if name == "bfloat16" else units[:1]
                flops = (2.0 if kind == "forward" else 6.0) * m * n * k
                cases.append((f"{kind} {shape}", name, flops, w.nbytes, impls, variants))
    read = common.ReadBandwidth()
    times = {}
    for _ in range(args.rounds):
        read()
        for shape, name, _, _, impls, variants in cases:
            for label, (amx_on, dot_on, rounding) in variants:
                opforge.set_amx_enabled(amx_on)
                opforge.set_bf16_dot_enabled(dot_on)
                opforge.set_bf16_grad_rounding_enabled(rounding)
                fn, sync = impls["opforge"]
                times.setdefault((shape, name, label), []).append(common.median_seconds(fn, args.repeats, sync=sync))
            opforge.set_amx_enabled(default[0])
            opforge.set_bf16_dot_enabled(default[1])
            opforge.set_bf16_grad_rounding_enabled(default[2])
            for label in ("torch eager", "jax.jit"):
                fn, sync = impls[label]
                times.setdefault((shape, name, label), []).append(common.median_seconds(fn, args.repeats, sync=sync))
    rows = []
    print(read.line())
    print(f"\n{'case':<22} {'dtype':<9} {'implementation':<26} {'ms':>9} {'GFLOP/s':>8} {'weight GB/s':>11} {'of read':>7} "
          f"{'opforge speedup':>15}")
    for shape, name, flops, weight_bytes, _, variants in cases:
        ours = statistics.median(times[(shape, name, "opforge")])
        for label in [v for v, _ in variants] + ["torch eager", "jax.jit"]:
            t = statistics.median(times[(shape, name, label)])
            gbs = weight_bytes / t / 1e9
            print(f"{shape:<22} {name:<9} {label:<26} {t * 1e3:>9.3f} {flops / t / 1e9:>8.1f} {gbs:>11.1f} "
                  f"{gbs / read.median:>7.0%} {t / ours:>14.2f}x")
            rows.append({"case": shape, "dtype": name, "impl": label, "median_ms": t * 1e3,
                         "GFLOP_per_s": flops / t / 1e9, "weight_GB_per_s": gbs,
                         "weight_fraction_of_read_bandwidth": gbs / read.median, "opforge_speedup": t / ours})
    print(f"\nwrote {common.write_csv(args.results, rows)}")
    labels = list(dict.fromkeys(r["impl"] for r in rows))
    groups = list(dict.fromkeys(f"{r['case']} {r['dtype']}" for r in rows))
    series = {label: [next((r["GFLOP_per_s"] for r in rows if f"{r['case']} {r['dtype']}" == g and r["impl"] == label),
                           0.0) for g in groups] for label in labels}
    print(f"wrote {common.bar_plot(args.results, 'linear_act (gelu) on the CPU', groups, series, 'GFLOP/s')}")


if __name__ == "__main__":
    main()
