"""Rewrites one of opforge's CUDA sources for the host emulator (cuda_emulator.h).

    python rewrite_launches.py SOURCE OUTPUT

Each launch `kernel<<<grid, block, shared, stream>>>(args)` becomes
`::cuda_emu::launch("kernel (file:line)", [&](auto... a) { kernel(a...); }, grid, block, shared,
stream)(args)`: the lambda lets template kernels deduce their arguments as the launch would. The
file's launch sites are declared at its end (cuda_emu::declare_launch_sites). OPFORGE_KERNEL
registrations become CUDA_EMU_KERNEL (the emulated backend). Line breaks are kept, and a #line
directive names the source, so diagnostics and __FILE__/__LINE__ point at the original.
"""
import pathlib
import re
import sys


def kernel_start(text: str, end: int) -> int:
    """Start of the kernel expression (`name`, `ns::name`, `name<T, 4>`) that ends at `end`."""
    i = end
    while i > 0 and text[i - 1].isspace():
        i -= 1
    depth = 0
    while i > 0:
        c = text[i - 1]
        if c == ">":
            depth += 1
        elif c == "<":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and not (c.isalnum() or c in "_:"):
            break
        i -= 1
    return i


def rewrite(text: str, source: str) -> str:
    out = []
    sites = []  # "kernel (file:line)" of each launch
    pos = 0
    while (open_ := text.find("<<<", pos)) >= 0:
        close = text.find(">>>", open_)
        if close < 0:
            raise SystemExit(f"{source}: '<<<' without '>>>'")
        start = kernel_start(text, open_)
        kernel = text[start:open_].strip()
        if not kernel:
            raise SystemExit(f"{source}: a launch without a kernel name before '<<<'")
        config = text[open_ + 3:close]
        line = text.count("\n", 0, start) + 1
        name = f'{" ".join(kernel.split())} ({source}:{line})'.replace('"', "")
        sites.append(name)
        out.append(text[pos:start])
        out.append(f'::cuda_emu::launch("{name}", [&](auto... cuda_emu_args) {{ {kernel}(cuda_emu_args...); }}, {config})')
        pos = close + 3
    out.append(text[pos:])
    body = "".join(out).replace("OPFORGE_KERNEL(", "CUDA_EMU_KERNEL(")
    if sites:  # the file's launch sites, for the tests' check that each one ran
        listed = ", ".join(f'"{s}"' for s in sites)
        tag = re.sub(r"\W", "_", source)
        body += f"\nstatic const bool cuda_emu_sites_{tag} = ::cuda_emu::declare_launch_sites({{{listed}}});\n"
    return f'#line 1 "{source}"\n{body}'


def main() -> None:
    source, output = map(pathlib.Path, sys.argv[1:3])
    text = rewrite(source.read_text(), source.as_posix())
    output.parent.mkdir(parents=True, exist_ok=True)
    if not output.exists() or output.read_text() != text:  # unchanged output: nothing to recompile
        output.write_text(text)


if __name__ == "__main__":
    main()
