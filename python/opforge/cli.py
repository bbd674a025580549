"""The `opforge` command: `opforge info`, `opforge tour`, `opforge new-op` and `opforge build-plugin`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _print_info(as_json: bool) -> None:
    import opforge

    info = opforge.info()
    if as_json:
        print(json.dumps(info, indent=2))
        return
    print(f"opforge {info['version']}")
    print(f"SIMD targets compiled: {', '.join(info['simd_compiled'])}")
    print(f"SIMD targets this CPU runs: {', '.join(info['simd_supported'])}")
    print(f"SIMD target chosen: {info['simd_chosen']}")
    for key, label in (("amx", "AMX (bfloat16 tiles)"), ("bf16_convert", "bfloat16 stores by AVX512_BF16"),
                       ("bf16_dot", "bfloat16 products by AVX512_BF16 (linear_act)")):
        unit = info[key]
        print(f"{label}: {'not supported' if not unit['supported'] else 'on' if unit['enabled'] else 'off'}")
    print(f"bfloat16 g in linear_act_backward: {'rounded' if info['bf16_grad_rounding'] else 'float32'}")
    print(f"CUDA kernels compiled: {'yes' if info['built_with_cuda'] else 'no'}")
    print(f"cuBLASLt (linear_act on CUDA): {info['cublaslt']}")
    print("Backends:")
    for b in info["backends"]:
        state = "available" if b["available"] else f"unavailable ({b['reason']})"
        print(f"  {b['name']:<6} device={b['device']:<5} score={b['score']:<3} devices={b['device_count']}  {state}")
    print(f"Threads: {info['num_threads']}")
    print(f"Plugins (OPFORGE_PLUGINS): {', '.join(info['plugins']) or 'none'}")
    print(f"Ops: {', '.join(info['ops'])}")


def _new_op(name: str, root: str, backward: bool) -> int:
    from .scaffold import ScaffoldError, new_op

    try:
        written = new_op(name, root, backward)
    except ScaffoldError as e:
        print(f"opforge {e}", file=sys.stderr)
        return 2
    for path in written:
        print(f"created {path}")
    folders = [f"ops/{name}"] + ([f"ops/{name}_backward"] if backward else [])
    checkout = (Path(root) / "CMakeLists.txt").exists() and (Path(root) / "ops" / "add_one").is_dir()
    if checkout:
        build = f"pip install --no-build-isolation -q . && python -m pytest {' '.join(folders)}"
    else:
        paths = " ".join(str(Path(root) / f) for f in folders)
        build = (f"export OPFORGE_PLUGINS=$(opforge build-plugin {paths})"
                 f"\n     python -m pytest {paths}   (docs/tutorial.md walks through it)")
    print(f"""
{name} computes x + 1 for now, and its tests pass once built. Next:
  1. ops/{name}/{name}.cc: the schema, dtypes and shape rule{f" ({name}_backward's too)" if backward else ""}
  2. ops/{name}/{name}_cpu.cc and {name}_cuda.cu: the kernels
  3. ops/{name}/reference.py and test_{name}.py: the references and tests
  4. {build}
CONTRIBUTING.md ("Add an op") says more.""")
    return 0


def _build_plugin(folders: list[str], output: str | None, verbose: bool) -> int:
    from .plugins import ENV_VAR, PluginError, build_plugin

    try:
        path = build_plugin(folders, output, verbose=verbose)
    except PluginError as e:
        print(f"opforge {e}", file=sys.stderr)
        return 2
    print(path)
    print(f"# load it in a new process: export {ENV_VAR}={path}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="opforge", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="version, SIMD targets, AMX, backends, threads")
    info.add_argument("--json", action="store_true", help="print as JSON")
    tour = sub.add_parser("tour", help="run every op in every installed framework against its reference")
    tour.add_argument("--frameworks", default="numpy,torch,jax,ggml",
                      help="comma-separated subset to try (ggml: the ggml-format ops against ggml's library)")
    tour.add_argument("--rows", type=int, default=512)
    tour.add_argument("--cols", type=int, default=1024)
    tour.add_argument("--repeats", type=int, default=30, help="timed calls per measurement (median)")
    tour.add_argument("--csv", help="also write the table to this CSV file")
    new = sub.add_parser("new-op", help="start a new op: its folder (and its backward's), from ops/add_one")
    new.add_argument("name", help="the op's name: lowercase letters, digits, underscores")
    new.add_argument("--root", default=".", help="the opforge checkout to write into (default: .)")
    new.add_argument("--no-backward", action="store_true", help="no backward op (and no autograd)")
    plugin = sub.add_parser("build-plugin", help="compile op folders into a library for OPFORGE_PLUGINS")
    plugin.add_argument("folders", nargs="+", help="op folders (ops/<name>/ layout)")
    plugin.add_argument("-o", "--output", help="the library to write (default: a cached one)")
    plugin.add_argument("-v", "--verbose", action="store_true", help="print the compiler commands")
    args = parser.parse_args(argv)

    if args.command == "info":
        _print_info(args.json)
        return 0
    if args.command == "new-op":
        return _new_op(args.name, args.root, not args.no_backward)
    if args.command == "build-plugin":
        return _build_plugin(args.folders, args.output, args.verbose)
    from .tour import run_tour

    return run_tour(frameworks=args.frameworks.split(","), rows=args.rows, cols=args.cols,
                    repeats=args.repeats, csv_path=args.csv)


if __name__ == "__main__":
    sys.exit(main())
