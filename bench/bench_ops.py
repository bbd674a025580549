"""Every op against torch eager, torch.compile, jax.jit and the machine's memory bandwidth.

    python bench/bench_ops.py [--ops rms_norm,softmax] [--sizes large,l2] [--no-compile] [--rounds 3]

For each op with a reference (ops/<name>/reference.py), at a size past the caches (64 MiB per
input) and one that fits in L2 (256 KiB per input), in float32: median time of each
implementation, GB/s (bytes read + written once, from the actual arrays), % of the STREAM
bandwidth measured in the same run on the same threads, and opforge's speedup over each
competitor (their time / ours). Compute-bound ops (the reference defines `flops`: linear_act)
are reported in GFLOP/s and % of the float32 matrix-product peak measured in the same run
(torch.mm, 2048^3) instead. With --rounds N the sweep runs N times and each figure is the median
over rounds (the committed results: --rounds 3). Writes bench/results/ops_cpu.csv and ops_cpu.png.
"""

from __future__ import annotations

import importlib
import sys

import numpy as np

import common

SIZES = {"large": (4096, 4096), "l2": (64, 1024)}  # (rows, cols): 64 MiB / 256 KiB per input


def implementations(name, size, ref, attrs, compile_torch):
    """name -> (callable on torch tensors or jax arrays, which inputs it takes)."""
    import opforge.torch

    # opforge as a torch user calls it: opforge.torch.<op> (the direct call on CPU tensors).
    impls = {"opforge": (lambda *a: getattr(opforge.torch, name)(*a, **attrs), "torch")}
    if not getattr(ref, "FRAMEWORK_NATIVE", True):  # the "framework" entries are NumPy in disguise
        return impls
    if hasattr(ref, "torch"):
        impls["torch eager"] = (lambda *a: ref.torch(*a, **attrs), "torch")
        if compile_torch:
            impls["torch.compile"] = (common.compile_per_case(lambda *a: ref.torch(*a, **attrs), f"{name}_{size}"),
                                      "torch")
    if hasattr(ref, "jax"):
        import jax

        impls["jax.jit"] = (jax.jit(lambda *a: ref.jax(*a, **attrs)), "jax")
    return impls


def run(ops, sizes, repeats, compile_torch, threads, rounds=1):
    """The sweep (common.sweep): per op, size and implementation the median over rounds of each
    round's median."""
    import opforge

    opforge.set_num_threads(threads)
    print(f"machine: {common.machine()}; {threads} threads for every implementation; {rounds} round(s)")
    cases = []  # common.sweep's cases
    rng = np.random.default_rng(0)
    for name in ops:
        ref = importlib.import_module(f"opforge.references.{name}")
        for size in sizes:
            r, c = SIZES[size]
            arrays, attrs, t_args, j_args = common.sample_inputs(ref, rng, r, c)
            out = getattr(opforge, name)(*t_args, **attrs)
            nbytes = sum(a.numel() * a.element_size() for a in t_args) + out.numel() * out.element_size()
            flops = ref.flops(arrays) if hasattr(ref, "flops") else None
            calls = {impl: (lambda fn=fn, args=(t_args if kind == "torch" else j_args): fn(*args), kind)
                     for impl, (fn, kind) in implementations(name, size, ref, attrs, compile_torch).items()}
            cases.append((name, size, r, c, nbytes, flops, calls))
    return common.sweep(cases, threads, repeats, rounds)


def main(argv=None):
    import opforge

    with_refs = [n for n in opforge._core.op_names()
                 if importlib.util.find_spec(f"opforge.references.{n}") and not n.endswith("_backward")]
    args = common.sweep_arguments(__doc__, with_refs).parse_args(argv)
    rows, peak = run(args.ops.split(","), args.sizes.split(","), args.repeats, not args.no_compile, args.threads,
                     args.rounds)
    common.report(rows, peak, "ops_cpu", "opforge vs competitors (float32, CPU)")


if __name__ == "__main__":
    sys.exit(main())
