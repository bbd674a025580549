"""Elementwise ops on inputs that are not row-major, against torch eager: transposed matrices,
channels-last activations, slices, a transposed operand beside a row-major one.

    python bench/bench_layouts.py [--n 2048] [--rounds 3] [--repeats 20]

Why: an elementwise op's result takes its inputs' layout (OpDef::elementwise, as torch's
TensorIterator does), so a kernel reads and writes both in memory order. Before 2026-11-27
opforge's results were row-major: a unary op on a transposed input wrote across the grain,
3-4x torch's time. Rows with a stride (x[:, ::2]) were copied into vectors lane by lane, 2-5x
torch's time; they are now deinterleaved (stride 2) or gathered (cpu/simd-inl.h's StridedRow). `contiguous` is the same op on a row-major input: the floor each layout is
measured against.

float32, n x n elements (16 MiB at the default: past L2), channels-last as [2, 64, n/16, n/8]
(a [2, n/16, n/8, 64] tensor permuted (0, 3, 1, 2)), the same element count. opforge's thread
count for both libraries.
Medians of `--repeats` calls, then the median over `--rounds` sweeps. ms per call; speedup =
torch's time / opforge's (> 1: opforge faster). Writes bench/results/layouts_cpu.csv and .png.
"""

import argparse
import statistics

import torch

import common
import opforge.torch  # noqa: F401  (registers torch.ops.opforge)

ops = torch.ops.opforge


def cases(n: int):
    """(label, opforge call, torch call) on fresh inputs."""
    x, y = torch.randn(n, n), torch.randn(n, n)
    row = torch.randn(n)
    nhwc = torch.randn(2, n // 16, n // 8, 64).permute(0, 3, 1, 2)  # channels-last [2, 64, n/16, n/8]: n * n
    bias = torch.randn(64, 1, 1)
    xh, yh = x.bfloat16(), y.bfloat16()
    narrow, y16 = torch.randn(n * n // 16, 32)[:, :16], torch.randn(n * n // 16, 16)  # n * n / 16 rows of 16
    sliced = torch.randn(n, 2 * n)[:, ::2]
    return [
        ("gelu contiguous", lambda: ops.gelu(x, "none"), lambda: torch.nn.functional.gelu(x)),
        ("gelu x.T", lambda: ops.gelu(x.T, "none"), lambda: torch.nn.functional.gelu(x.T)),
        ("relu x.T", lambda: ops.relu(x.T), lambda: torch.relu(x.T)),
        ("silu channels-last", lambda: ops.silu(nhwc), lambda: torch.nn.functional.silu(nhwc)),
        ("relu x[:, ::2]", lambda: ops.relu(sliced), lambda: torch.relu(sliced)),
        ("gelu x[:, ::2]", lambda: ops.gelu(sliced, "none"), lambda: torch.nn.functional.gelu(sliced)),
        ("add x[:, ::2] + y", lambda: ops.add(sliced, y), lambda: sliced + y),
        ("add contiguous", lambda: ops.add(x, y), lambda: x + y),
        ("add x.T + y.T", lambda: ops.add(x.T, y.T), lambda: x.T + y.T),
        ("add x.T + y", lambda: ops.add(x.T, y), lambda: x.T + y),
        ("add x.T + row", lambda: ops.add(x.T, row), lambda: x.T + row),
        ("mul channels-last * bias", lambda: ops.mul(nhwc, bias), lambda: nhwc * bias),
        ("gelu_backward x.T", lambda: ops.gelu_backward(y.T, x.T, "none"),
         lambda: torch.ops.aten.gelu_backward(y.T, x.T)),
        ("gelu_backward g.T, x", lambda: ops.gelu_backward(y.T, x, "none"),
         lambda: torch.ops.aten.gelu_backward(y.T, x)),
        ("add bfloat16 x.T + y", lambda: ops.add(xh.T, yh), lambda: xh.T + yh),
        ("relu x[:, :16] (32 wide)", lambda: ops.relu(narrow), lambda: torch.relu(narrow)),
        ("gelu x[:, :16] (32 wide)", lambda: ops.gelu(narrow, "none"), lambda: torch.nn.functional.gelu(narrow)),
        ("add x[:, :16] + y", lambda: ops.add(narrow, y16), lambda: narrow + y16),
        ("mul_backward g.T, x, y", lambda: ops.mul_backward(y.T, x, y), lambda: (y.T * y, y.T * x)),
        ("softmax x.T", lambda: ops.softmax(x.T), lambda: torch.softmax(x.T, -1)),
        ("rms_norm x.T", lambda: ops.rms_norm(x.T, row), lambda: torch.nn.functional.rms_norm(x.T, (n,), row, 1e-6)),
        ("layer_norm x.T", lambda: ops.layer_norm(x.T, row, row),
         lambda: torch.nn.functional.layer_norm(x.T, (n,), row, row)),
    ]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2048)
    args = common.start_against_torch(parser, lambda a: f"float32, {a.n} x {a.n} elements")
    torch.manual_seed(0)
    runs = cases(args.n)
    for label, ours, theirs in runs:  # torch's values, before anything is timed; its layout, since 2026-11-27
        got, want = ours(), theirs()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for g, w in zip(*((t,) if isinstance(t, torch.Tensor) else tuple(t) for t in (got, want))):
            if g.stride() != w.stride():
                print(f"{label}: opforge's result has strides {g.stride()}, torch's {w.stride()}")
    times = {}
    for _ in range(args.rounds):
        for label, ours, theirs in runs:
            for impl, fn in (("opforge", ours), ("torch eager", theirs)):
                times.setdefault((label, impl), []).append(common.median_seconds(fn, repeats=args.repeats))
    rows = []
    print(f"\n{'case':<26} {'opforge ms':>10} {'torch ms':>9} {'speedup':>8}")
    for label, _, _ in runs:
        ours, theirs = (statistics.median(times[(label, i)]) for i in ("opforge", "torch eager"))
        print(f"{label:<26} {ours * 1e3:>10.3f} {theirs * 1e3:>9.3f} {theirs / ours:>7.2f}x")
        for impl, t in (("opforge", ours), ("torch eager", theirs)):
            rows.append({"case": label, "impl": impl, "ms": t * 1e3, "opforge_speedup": theirs / ours})
    print(f"\nwrote {common.write_csv('layouts_cpu', rows)}")
    groups = [label for label, _, _ in runs]
    series = {impl: [r["ms"] for r in rows if r["impl"] == impl] for impl in ("opforge", "torch eager")}
    print(f"wrote {common.bar_plot('layouts_cpu', 'elementwise ops by input layout (lower is better)', groups, series, 'ms')}")


if __name__ == "__main__":
    main()
