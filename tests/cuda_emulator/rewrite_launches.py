"""Rewrites one of opforge's CUDA sources for the host emulator (cuda_emulator.h).

    python rewrite_launches.py SOURCE OUTPUT

Each launch `kernel<<<grid, block, shared, stream>>>(args)` becomes
`::cuda_emu::launch("kernel (file:line)", [&](auto... a) { kernel(a...); }, grid, block, shared,
stream)(args)`: the lambda lets template kernels deduce their arguments as the launch would. The
file's launch sites are declared at its end (cuda_emu::declare_launch_sites). OPFORGE_KERNEL
registrations become CUDA_EMU_KERNEL (the emulated backend), and __CUDA_ARCH__ CUDA_EMU_ARCH (900,
cuda_emulator.h: the sm_80+ code the package runs). A kernel's __launch_bounds__ becomes a
check at its start, and each __shared__ declaration is poisoned per block (see the functions below). Line breaks are kept, and a #line
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


def closing(text: str, open_: int) -> int:
    """Index of the bracket that closes the one at `open_` ('(' or '[')."""
    pairs = {"(": ")", "[": "]"}
    depth = 0
    for i in range(open_, len(text)):
        if text[i] in pairs:
            depth += 1
        elif text[i] in pairs.values():
            depth -= 1
            if depth == 0:
                return i
    raise SystemExit(f"unbalanced bracket at {open_}")


def top_level_split(text: str) -> list:
    """`text` cut at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += c in "(["
        depth -= c in ")]"
        if c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def check_launch_bounds(text: str) -> str:
    """`__launch_bounds__(B, ...) kernel(params) {` gets `::cuda_emu::check_launch_bounds(B);` as
    the body's first statement: a launch with more threads fails on the GPU."""
    out, pos = [], 0
    for match in re.finditer(r"__global__\s+void\s+__launch_bounds__\(", text):
        at = match.end() - len("__launch_bounds__(")
        args_end = closing(text, at + len("__launch_bounds__"))
        bound = top_level_split(text[at + len("__launch_bounds__") + 1:args_end])[0].strip()
        params = closing(text, text.index("(", args_end + 1))
        body = text.index("{", params)
        out.append(text[pos:body + 1] + f" ::cuda_emu::check_launch_bounds({bound});")
        pos = body + 1
    return "".join(out) + text[pos:]


def poison_shared(text: str) -> str:
    """Each `__shared__ T a[..], b[..];` is followed by ::cuda_emu::poison_shared for each name: the
    first thread of a block to reach it fills it with 0xff bytes, as uninitialized shared memory."""
    out, pos = [], 0
    for match in re.finditer(r"^[ \t]*__shared__", text, re.MULTILINE):
        at = match.end() - len("__shared__")
        end = text.index(";", at)
        declaration = re.sub(r"__align__\([^)]*\)", "", text[at + len("__shared__"):end])
        names = [re.match(r"\s*([^\[]*?)\s*(\[|$)", part).group(1).split()[-1] for part in top_level_split(declaration)]
        out.append(text[pos:end + 1] + "".join(f" ::cuda_emu::poison_shared(&{n}, sizeof({n}));" for n in names))
        pos = end + 1
    return "".join(out) + text[pos:]


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
    body = poison_shared(check_launch_bounds("".join(out))).replace("OPFORGE_KERNEL(", "CUDA_EMU_KERNEL(")
    # The device code the package runs (it is built for sm_80 and up), not the fallbacks for older
    # GPUs the host compiler would pick with __CUDA_ARCH__ undefined.
    body = re.sub(r"\b__CUDA_ARCH__\b", "CUDA_EMU_ARCH", body)
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
