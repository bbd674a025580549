"""Ops compiled outside opforge's own build, without rebuilding opforge.

`build_plugin(folders)` compiles op folders (each laid out like `ops/<name>/`: the declaration
`<name>.cc`, the Highway kernel `<name>_cpu.cc` and the CUDA kernel `<name>_cuda.cu`, as
`opforge new-op` writes them) into one shared library, with the compiler flags, CUDA
architectures and headers opforge itself was built with, and caches it by content. The `.cu`
files are compiled where opforge was built with CUDA and nvcc is found (else a warning). A
process started with `OPFORGE_PLUGINS=<library>[:<library>...]` loads those libraries when it
imports opforge, before it makes any op's functions, so a plugin's ops are
opforge ops like the built-in ones: `opforge.<op>` for NumPy, DLPack, torch and JAX arrays,
`torch.ops.opforge.<op>` with autograd and torch.compile, `opforge.jax.<op>` under jit, grad
and vmap, and (from each folder's reference.py, kept beside the library) `opforge.references`,
which the tour and `opforge.testing.reference` read. `opforge.load_plugin(library)` loads one
later, in a running process (a notebook): its ops join every frontend already imported too.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
# What CMakeLists.txt and cmake/simd.cmake give every op source: the same Highway targets
# (one per-target table shared with libhwy), C++20, position-independent code, no implicit FMA.
FLAGS = ["-std=gnu++20", "-O3", "-fPIC", "-ffp-contract=off", "-DHWY_DISABLED_TARGETS=HWY_SSSE3", "-DHWY_SHARED_DEFINE"]
ENV_VAR = "OPFORGE_PLUGINS"


class PluginError(RuntimeError):
    """A plugin that could not be built; the message names the file and carries the compiler's."""


def include_dir() -> Path:
    """opforge's C++ headers as installed with the package (`opforge/registry.h`, `cpu/...`)."""
    return PACKAGE / "include"


def cache_dir() -> Path:
    """Where built plugins are kept: $OPFORGE_CACHE_DIR, else $XDG_CACHE_HOME/opforge or ~/.cache/opforge."""
    if os.environ.get("OPFORGE_CACHE_DIR"):
        return Path(os.environ["OPFORGE_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "opforge"


def _sources(folders: list[Path]) -> list[Path]:
    """The folders' C++ (.cc) and CUDA (.cu) sources."""
    sources = []
    for folder in folders:
        if not folder.is_dir():
            raise PluginError(f"build_plugin(): 'folders' must be op folders, {folder} is not a directory")
        if not (folder / f"{folder.name}.cc").exists():
            raise PluginError(f"build_plugin(): {folder} has no declaration {folder.name}.cc (an op folder is "
                              f"named after its op: ops/<name>/<name>.cc, <name>_cpu.cc)")
        sources += sorted(folder.glob("*.cc")) + sorted(folder.glob("*.cu"))
    return sources


class _Cuda:
    """How this opforge compiled its CUDA kernels, for a plugin's .cu files: the same nvcc (or
    $CUDACXX), architectures and static CUDA runtime. None where opforge was built without CUDA
    or no nvcc is found."""

    def __init__(self, nvcc: str, architectures: str, library_dir: str):
        self.nvcc, self.library_dir = nvcc, library_dir
        self.arch_flags = []
        for arch in filter(None, architectures.split(",")):
            if arch in ("native", "all", "all-major"):
                self.arch_flags.append(f"-arch={arch}")
                continue
            number, _, kind = arch.partition("-")
            codes = {"real": [f"sm_{number}"], "virtual": [f"compute_{number}"]}.get(
                kind, [f"compute_{number}", f"sm_{number}"])
            self.arch_flags.append(f"--generate-code=arch=compute_{number},code=[{','.join(codes)}]")

    @staticmethod
    def find():
        from . import _core

        if not _core.built_with_cuda:
            return None
        found = (shutil.which(c) for c in (os.environ.get("CUDACXX"), _core.cuda_compiler, "nvcc") if c)
        nvcc = next(filter(None, found), None)
        return _Cuda(nvcc, _core.cuda_architectures, _core.cuda_library_dir) if nvcc else None

    def key(self) -> str:
        return " ".join([self.nvcc, *self.arch_flags])


def _references(sources: list[Path]) -> list[Path]:
    folders = sorted({p.parent for p in sources})
    return [f / "reference.py" for f in folders if (f / "reference.py").exists()]


def references_dir(library: Path) -> Path:
    """Where build_plugin keeps the plugin's references (<op>.py), beside the library."""
    return library.with_name(library.name.removesuffix(".so") + "_references")


def abi_file(library: Path) -> Path:
    """Beside a built plugin: the abi() of the opforge it was compiled against."""
    return library.with_name(library.name.removesuffix(".so") + ".abi")


def abi() -> str:
    """This opforge's plugin ABI: its version, build flags and installed headers. A plugin built
    against other headers may lay out TensorView or KernelCall differently: loading it could
    crash, so it is refused instead."""
    import hashlib

    import opforge

    h = hashlib.sha256()
    for part in [opforge.__version__, *FLAGS]:
        h.update(part.encode() + b"\0")
    for header in sorted(include_dir().rglob("*.h*")):
        h.update(header.relative_to(include_dir()).as_posix().encode() + b"\0" + header.read_bytes())
    return h.hexdigest()[:16]


def _key(sources: list[Path], compiler: str) -> str:
    import hashlib

    h = hashlib.sha256()
    for part in [abi(), compiler, str(PACKAGE)]:
        h.update(part.encode() + b"\0")
    for path in sources + _references(sources):
        h.update(path.parent.name.encode() + b"/" + path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def build_plugin(folders, output: str | Path | None = None, *, compiler: str | None = None,
                 verbose: bool = False) -> Path:
    """Compiles the op folders into one shared library and returns its path (for OPFORGE_PLUGINS).
    Without `output`, the library goes to cache_dir() under a name made from the sources, the
    headers and the compiler, and an unchanged plugin is not compiled again."""
    import tempfile
    from concurrent.futures import ThreadPoolExecutor  # here, not at import: `import opforge` loads this module

    folders = [Path(f).resolve() for f in ([folders] if isinstance(folders, (str, Path)) else folders)]
    if not folders:
        raise PluginError("build_plugin(): 'folders' must name at least one op folder, got none")
    names = [f.name for f in folders]
    if len(set(names)) != len(names):
        raise PluginError(f"build_plugin(): 'folders' must have distinct names, got {names}")
    sources = _sources(folders)
    has_cuda = any(p.suffix == ".cu" for p in sources)
    cuda = _Cuda.find() if has_cuda else None
    if has_cuda and cuda is None:
        import warnings

        from . import _core

        warnings.warn("build_plugin(): the plugin is built without its CUDA kernels (.cu files): "
                      + ("no nvcc found (set CUDACXX)" if _core.built_with_cuda else "opforge was built without CUDA"),
                      stacklevel=2)
        sources, has_cuda = [p for p in sources if p.suffix != ".cu"], False
    asked = compiler or os.environ.get("CXX")
    compiler = shutil.which(asked) if asked else shutil.which("g++") or shutil.which("c++")
    if not compiler:
        raise PluginError(f"build_plugin(): no C++ compiler found ({f'{asked!r} is not a program' if asked else 'set CXX or install g++'})")
    if not (PACKAGE / "libopforge.so").exists() or not (include_dir() / "opforge" / "registry.h").exists():
        raise PluginError(f"build_plugin(): this opforge install has no libopforge.so or headers in {PACKAGE}")
    key = _key(sources, compiler + (f" {cuda.key()}" if cuda else ""))
    target = Path(output) if output else cache_dir() / f"opforge_plugin_{key}.so"
    if output is None and target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="opforge-plugin-") as tmp:
        # The kernels name themselves as "ops/<name>/<name>_cpu.cc" (HWY_TARGET_INCLUDE, relative
        # to an include root): give them one, wherever the folders really are.
        root = Path(tmp) / "root"
        (root / "ops").mkdir(parents=True)
        for folder in folders:
            (root / "ops" / folder.name).symlink_to(folder, target_is_directory=True)
        includes = [f"-I{include_dir()}", f"-I{root}"]

        def compile_one(source: Path) -> Path:
            obj = Path(tmp) / f"{source.parent.name}__{source.name}.o"
            where = str(root / "ops" / source.parent.name / source.name)
            if source.suffix == ".cu":  # as cmake/cuda.cmake compiles opforge's own
                command = [cuda.nvcc, "-std=c++20", "-O3", "-Xcompiler=-fPIC", *cuda.arch_flags, *includes,
                           "-c", where, "-o", str(obj)]
            else:
                command = [compiler, *FLAGS, *includes, "-c", where, "-o", str(obj)]
            _run(command, f"compiling {source}", verbose)
            return obj

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            objects = list(pool.map(compile_one, sources))
        # libopforge.so by its soname: the loader reuses the copy the process already has, so the
        # plugin's ops join that copy's registry.
        partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        # CUDA kernels link the static CUDA runtime, as libopforge.so does: streams and device
        # memory are the driver's, so the two runtimes' handles are interchangeable. What static
        # archives bring (that runtime; libstdc++ where the compiler links it statically) stays
        # hidden in the plugin, as in libopforge.so (CMakeLists.txt says why).
        cuda_libs = ([f"-L{cuda.library_dir}", "-lcudart_static", "-ldl", "-lrt", "-lpthread"]
                     if has_cuda else [])
        _run([compiler, "-shared", *map(str, objects), "-o", str(partial), f"-L{PACKAGE}", "-lopforge", "-lhwy",
              *cuda_libs, f"-Wl,-rpath,{PACKAGE}", "-Wl,--exclude-libs,ALL"], f"linking {target.name}", verbose)
        refs = references_dir(target)
        shutil.rmtree(refs, ignore_errors=True)
        for ref in _references(sources):
            refs.mkdir(exist_ok=True)
            shutil.copyfile(ref, refs / f"{ref.parent.name}.py")
        abi_file(target).write_text(abi() + "\n")
        os.replace(partial, target)  # whole or absent, for a process loading it meanwhile
    return target


def _run(command: list[str], what: str, verbose: bool) -> None:
    import subprocess

    if verbose:
        print(" ".join(command), file=sys.stderr)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise PluginError(f"build_plugin(): {what} failed ({Path(command[0]).name} exit {done.returncode}):\n"
                          f"{done.stderr.strip()[-6000:]}")


def load(path: str, error: type[Exception] = ImportError, who: str = ENV_VAR) -> None:
    """Loads one plugin library into the process (its ops register themselves as it loads) and
    adds its references to opforge.references. `error` (naming `who`) when its ABI stamp is not
    this opforge's or the library cannot be loaded. The ops registered before it are sealed
    first: a plugin may not add kernels to them (their kernel lists are read without a lock)."""
    import ctypes

    from . import _core

    stamp = abi_file(Path(path))
    # A library without the stamp was linked by hand: loaded as its author asked.
    if stamp.exists() and stamp.read_text().strip() != abi():
        raise error(f"opforge: {who}: {path} was built against another opforge (other headers or version); "
                    f"rebuild it: opforge build-plugin <its op folders>")
    _core.seal_ops()
    try:
        ctypes.CDLL(path)
    except OSError as e:
        raise error(f"opforge: {who}: cannot load {path}: {e}") from None
    refs = references_dir(Path(path))
    if refs.is_dir():
        import opforge.references

        if str(refs) not in opforge.references.__path__:
            opforge.references.__path__.append(str(refs))


def load_from_environment() -> list[str]:
    """Loads the libraries named by OPFORGE_PLUGINS (called by `import opforge`, before the ops'
    functions are made); returns their paths. ImportError naming the variable and the library
    when one cannot be loaded."""
    loaded = []
    for path in filter(None, os.environ.get(ENV_VAR, "").split(os.pathsep)):
        load(path)
        loaded.append(path)
    return loaded
