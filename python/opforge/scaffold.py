"""`opforge new-op NAME`: a new op's folder, made from `ops/add_one` (the smallest complete op:
declaration, CPU kernel for every SIMD target, CUDA kernel, references, tests) and, unless
told otherwise, its backward from `ops/add_one_backward`, with every name changed. The result
builds and passes its tests as it stands (it computes x + 1 under the new name), so an author
starts from green and edits the schema, kernels, references and tests from there."""

from __future__ import annotations

import keyword
import re
from pathlib import Path

TEMPLATE = "add_one"
NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
MAX_NAME = 48
# The template's name where it stands as a name, not inside another word (`madd_one`).
TEMPLATE_WORD = re.compile(r"(?<![A-Za-z0-9])" + TEMPLATE)
COPIED_SUFFIXES = (".cc", ".cu", ".h", ".py")


class ScaffoldError(ValueError):
    """A name or folder `new_op` cannot use; the message says which and why."""


def _check_name(name: str, ops_dir: Path, backward: bool) -> None:
    if not NAME.match(name):
        raise ScaffoldError(f"new-op: 'name' must be lowercase letters, digits and underscores, "
                            f"starting with a letter, got {name!r}")
    if len(name) > MAX_NAME:
        raise ScaffoldError(f"new-op: 'name' must be at most {MAX_NAME} characters, got {len(name)}")
    if keyword.iskeyword(name):
        raise ScaffoldError(f"new-op: 'name' must not be a Python keyword, got {name!r}")
    if name.endswith("_backward"):
        raise ScaffoldError(f"new-op: 'name' must not end in '_backward' (the backward op is made "
                            f"beside the op), got {name!r}")
    for folder in [name] + ([f"{name}_backward"] if backward else []):
        if (ops_dir / folder).exists():
            raise ScaffoldError(f"new-op: ops/{folder} already exists; choose another name")
    try:
        import opforge
    except ImportError:  # a checkout without a build: the folders above are all there is to check
        return
    # Ops become attributes of the opforge module: no op may take the name of one, nor of a
    # submodule not imported yet (the same rule `import opforge` enforces on plugins).
    taken = {op["name"] for op in opforge.ops()} | set(dir(opforge)) | opforge._SUBMODULES
    for used in [name] + ([f"{name}_backward"] if backward else []):
        if used in taken:
            raise ScaffoldError(f"new-op: 'name' {used!r} is already an op or an attribute of the "
                                f"opforge module; choose another name")


def _renamed(text: str, name: str, backward: bool) -> str:
    text = TEMPLATE_WORD.sub(name, text)
    text = text.replace("The smallest complete op: a template to copy.",
                        f"Made by `opforge new-op` from {TEMPLATE}: edit from here.")
    if not backward:  # no backward op: the declaration must not name one
        text = re.sub(r"\n\s*\.backward\([^\n]*\)", "", text)
    return text


# The template as installed with the package, for authors without a checkout (op folders built
# with `opforge build-plugin`).
PACKAGED_TEMPLATES = Path(__file__).resolve().parent / "templates"


def _template_dir(ops_dir: Path, folder: str) -> Path:
    """A checkout's own ops/<folder> (it may be newer), else the one installed with opforge."""
    for candidate in (ops_dir / folder, PACKAGED_TEMPLATES / folder):
        if candidate.is_dir():
            return candidate
    raise ScaffoldError(f"new-op: no template: neither {ops_dir / folder} nor {PACKAGED_TEMPLATES / folder} exists "
                        "(a damaged install?)")


def new_op(name: str, root: str | Path = ".", backward: bool = True) -> list[Path]:
    """Creates ops/<name>/ (and ops/<name>_backward/ when `backward`) under `root` (an opforge
    checkout, or any folder for ops built with `opforge build-plugin`); returns the files
    written. Raises ScaffoldError for a name already taken or not usable as an op, module
    attribute and C++ identifier."""
    ops_dir = Path(root) / "ops"
    sources = [TEMPLATE] + ([f"{TEMPLATE}_backward"] if backward else [])
    templates = [_template_dir(ops_dir, source) for source in sources]
    _check_name(name, ops_dir, backward)
    written = []
    for source, template in zip(sources, templates):
        target = ops_dir / source.replace(TEMPLATE, name, 1)
        target.mkdir(parents=True)
        for path in sorted(template.iterdir()):
            if path.is_file() and path.suffix in COPIED_SUFFIXES:
                out = target / path.name.replace(TEMPLATE, name, 1)
                out.write_text(_renamed(path.read_text(), name, backward))
                written.append(out)
    return written
