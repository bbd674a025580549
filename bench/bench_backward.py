"""Training steps: each differentiable op's forward and backward against torch eager autograd,
torch.compile (AOTAutograd's compiled backward), jax.jit(vjp) and the memory bandwidth.

    python bench/bench_backward.py [--ops rms_norm,softmax] [--sizes large,l2] [--no-compile] [--rounds 3]
                                   [--frozen x | --frozen weight,bias]

One step is what a training loop runs per op: the forward on fresh inputs, then the gradients
of every differentiable input (the op's declaration names them) for a given cotangent. opforge
runs as a torch user calls it, `opforge.torch.<op>` and `torch.autograd.grad`, so its backward
is the declared backward op called by the autograd function; JAX returns the forward result
and the gradients from one jitted function, so XLA may fuse the two passes (torch.compile
compiles them as two graphs).

Sizes and dtype as bench_ops.py (float32; large = 4096x4096 per input, l2 = 64x1024). The
traffic of a step is counted once for every implementation, as opforge's two ops move it:
forward (inputs + result) plus backward op (its tensor arguments: cotangent, saved inputs or
result; and the gradients it writes, those its output_mask asks for; not a saving forward's
extra results: only linear_act has one, and it is measured in flops; nothing where the
gradients are the cotangent itself, add_one's: torch's autograd runs no kernel there either);
GB/s and % of the STREAM bandwidth measured in the same run follow from it. linear_act is
compute-bound: 3 products (2 m n k flops each), in GFLOP/s and % of torch's float32 mm rate. Speedups are their time / ours (> 1: opforge faster). Writes
bench/results/backward_cpu.csv and backward_cpu.png.

--frozen names inputs that want no gradient (every implementation is asked for the others
only): `x` is a network's first layer, `weight,bias` a frozen layer under fine-tuning. opforge's
backward op then computes only the wanted gradients (its output_mask), as torch's autograd does;
a linear_act step counts one product per wanted grad_x or grad_weight. Writes
backward_cpu_frozen_<names>.csv and .png (names joined by _).
"""

from __future__ import annotations

import importlib
import sys

import numpy as np

import common
from bench_ops import SIZES


def differentiable_positions(name):
    """Positions of the inputs the op returns gradients for, and the backward op's name."""
    import opforge

    op = opforge._core.op(name)
    backward_name, differentiable = op.backward
    tensors = [a["name"] for a in op.args if a["kind"].startswith("Tensor")]
    return [tensors.index(n) for n in differentiable], backward_name


def step_bytes(name, backward_name, t_args, out, diff):
    """Bytes a step moves as opforge computes it: forward inputs and result, then the backward
    op's tensor arguments (bound by name as opforge's autograd binds them) and its results;
    no backward traffic where every gradient is the cotangent itself (identity_gradient)."""
    import opforge

    nbytes = lambda t: t.numel() * t.element_size()  # noqa: E731
    forward = sum(nbytes(t) for t in t_args) + nbytes(out)
    tensor_names = [a["name"] for a in opforge._core.op(name).args if a["kind"].startswith("Tensor")]
    identity = set(opforge._core.op(name).identity_gradient)
    computed = [i for i in diff if not (tensor_names[i] in identity and t_args[i].shape == out.shape)]
    if not computed:
        return forward
    named = dict(zip((a["name"] for a in opforge._core.op(name).args), t_args))
    named["grad"] = named["result"] = out
    backward = sum(nbytes(named[a["name"]]) for a in opforge._core.op(backward_name).args if a["name"] in named)
    return forward + backward + sum(nbytes(t_args[i]) for i in computed)  # the output_mask's gradients only


def torch_step(forward, args, positions):
    """(inputs, cotangent) -> a callable running forward + torch.autograd.grad."""
    import torch

    leaves = [a.detach().requires_grad_(i in positions) for i, a in enumerate(args)]
    wrt = [leaves[i] for i in positions]
    cotangent = torch.randn_like(forward(*leaves))

    def step():
        out = forward(*leaves)
        return out, torch.autograd.grad(out, wrt, cotangent)

    return step


def jax_step(forward, args, positions):
    """A jitted function returning the forward result and the vjp of every differentiable input."""
    import jax

    def both(args, cotangent):
        def of_differentiable(*wrt):
            full = list(args)
            for i, w in zip(positions, wrt):
                full[i] = w
            return forward(*full)

        out, vjp = jax.vjp(of_differentiable, *(args[i] for i in positions))
        return out, vjp(cotangent)

    jitted = jax.jit(both)
    cotangent = jax.numpy.asarray(np.random.default_rng(1).standard_normal(jax.eval_shape(forward, *args).shape),
                                  dtype=np.float32)
    return lambda: jitted(args, cotangent)


def implementations(name, size, ref, attrs, positions, t_args, j_args, compile_torch):
    """impl name -> (step callable, "torch" or "jax")."""
    import opforge.torch

    impls = {"opforge": (torch_step(lambda *a: getattr(opforge.torch, name)(*a, **attrs), t_args, positions), "torch"),
             "torch eager": (torch_step(lambda *a: ref.torch(*a, **attrs), t_args, positions), "torch")}
    if compile_torch:
        compiled = common.compile_per_case(lambda *a: ref.torch(*a, **attrs), f"{name}_{size}_train")
        impls["torch.compile"] = (torch_step(compiled, t_args, positions), "torch")
    impls["jax.jit"] = (jax_step(lambda *a: ref.jax(*a, **attrs), j_args, positions), "jax")
    return impls


def trainable_ops():
    """Ops with a backward op and torch and JAX references (not the ggml ops: no gradients)."""
    import opforge

    names = []
    for n in opforge._core.op_names():
        if opforge._core.op(n).backward is None or not importlib.util.find_spec(f"opforge.references.{n}"):
            continue
        ref = importlib.import_module(f"opforge.references.{n}")
        if getattr(ref, "FRAMEWORK_NATIVE", True) and hasattr(ref, "torch") and hasattr(ref, "jax"):
            names.append(n)
    return names


def run(ops, sizes, repeats, compile_torch, threads, rounds=1, frozen=()):
    import opforge

    opforge.set_num_threads(threads)
    print(f"machine: {common.machine()}; {threads} threads for every implementation; {rounds} round(s)")
    cases = []
    rng = np.random.default_rng(0)
    for name in ops:
        ref = importlib.import_module(f"opforge.references.{name}")
        positions, backward_name = differentiable_positions(name)
        tensors = [a["name"] for a in opforge._core.op(name).args if a["kind"].startswith("Tensor")]
        positions = [i for i in positions if tensors[i] not in frozen]
        if not positions:
            print(f"{name}: every differentiable input is frozen; skipped")
            continue
        for size in sizes:
            r, c = SIZES[size]
            arrays, attrs, t_args, j_args = common.sample_inputs(ref, rng, r, c)
            out = getattr(opforge.torch, name)(*t_args, **attrs)
            nbytes = step_bytes(name, backward_name, t_args, out, positions)
            # forward + the backward products wanted: grad_x = g @ weight, grad_weight = g^T @ x
            products = 1 + sum(tensors[i] in ("x", "weight") for i in positions)
            flops = products * ref.flops(arrays) if hasattr(ref, "flops") else None
            impls = implementations(name, size, ref, attrs, positions, t_args, j_args, compile_torch)
            cases.append((name, size, r, c, nbytes, flops, impls))
    return common.sweep(cases, threads, repeats, rounds)


def main(argv=None):
    parser = common.sweep_arguments(__doc__, trainable_ops())
    parser.add_argument("--frozen", default="", help="inputs that want no gradient, e.g. x or weight,bias")
    args = parser.parse_args(argv)
    frozen = [n for n in args.frozen.split(",") if n]
    rows, peak = run(args.ops.split(","), args.sizes.split(","), args.repeats, not args.no_compile, args.threads,
                     args.rounds, frozen)
    name = "backward_cpu" + (f"_frozen_{'_'.join(frozen)}" if frozen else "")
    title = "forward + backward step (float32, CPU)" + (f", frozen {', '.join(frozen)}" if frozen else "")
    common.report(rows, peak, name, title, "GB/s (step traffic)")


if __name__ == "__main__":
    sys.exit(main())
