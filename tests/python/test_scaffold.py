"""`opforge new-op`: the folders it writes (every name changed, nothing of the template's left),
that they compile with the build's flags (g++ for the declaration and the per-target CPU
kernels, nvcc for the CUDA kernels where it is installed), and its refusals."""

import py_compile
import shutil
import subprocess
from pathlib import Path

import pytest

from opforge.cli import main
from opforge import scaffold
from opforge.scaffold import ScaffoldError, new_op

REPO = Path(__file__).resolve().parents[2]
FILES = ["{n}.cc", "{n}_cpu.cc", "{n}_cuda.cu", "reference.py", "test_{n}.py"]


@pytest.fixture
def checkout(tmp_path):
    """A stand-in checkout holding the two template folders, so the real one stays untouched."""
    for folder in ("add_one", "add_one_backward"):
        shutil.copytree(REPO / "ops" / folder, tmp_path / "ops" / folder)
    (tmp_path / "CMakeLists.txt").write_text("# stands for the real one\n")
    return tmp_path


def written_names(root, name):
    return sorted(str(p.relative_to(root)) for p in (root / "ops").glob(f"{name}*/*") if p.is_file())


def test_writes_the_op_and_its_backward_renamed(checkout, capsys):
    assert main(["new-op", "scale_by", "--root", str(checkout)]) == 0
    want = sorted([f"ops/scale_by/{f.format(n='scale_by')}" for f in FILES] +
                  [f"ops/scale_by_backward/{f.format(n='scale_by_backward')}" for f in FILES])
    assert written_names(checkout, "scale_by") == want
    for path in want:
        text = (checkout / path).read_text()
        assert "add_one" not in text.replace("`opforge new-op` from add_one", ""), path  # only the provenance
        if path.endswith(".py"):
            py_compile.compile(str(checkout / path), doraise=True)
    decl = (checkout / "ops/scale_by/scale_by.cc").read_text()
    assert "OPFORGE_OP(scale_by)" in decl and '"scale_by(Tensor x) -> Tensor"' in decl
    assert '.backward("scale_by_backward", {"x"})' in decl
    assert "Made by `opforge new-op` from add_one" in decl
    cpu = (checkout / "ops/scale_by/scale_by_cpu.cc").read_text()
    assert '#define HWY_TARGET_INCLUDE "ops/scale_by/scale_by_cpu.cc"' in cpu
    assert "OPFORGE_KERNEL(scale_by," in cpu and "namespace opforge::scale_by_cpu" in cpu
    out = capsys.readouterr().out
    assert "python -m pytest ops/scale_by ops/scale_by_backward" in out
    # The template itself is untouched.
    assert "OPFORGE_OP(add_one)" in (checkout / "ops/add_one/add_one.cc").read_text()


def test_without_backward_the_declaration_names_none(checkout):
    written = new_op("clamp_to_one", checkout, backward=False)
    assert {p.parent.name for p in written} == {"clamp_to_one"}
    assert not (checkout / "ops/clamp_to_one_backward").exists()
    decl = (checkout / "ops/clamp_to_one/clamp_to_one.cc").read_text()
    assert ".backward(" not in decl and ".maps_over_leading_dims" in decl


def compile_commands(checkout, name):
    """The build's own way to compile each source (CMakeLists.txt: the same defines and include
    roots), syntax and templates only, no object written."""
    flags = ["-DHWY_DISABLED_TARGETS=HWY_SSSE3", f"-I{REPO / 'include'}", f"-I{checkout}"]
    cc = [["g++", "-std=gnu++20", "-fsyntax-only", *flags, str(p)]
          for p in sorted((checkout / "ops").glob(f"{name}*/*.cc"))]
    nvcc = shutil.which("nvcc") or shutil.which("/usr/local/cuda/bin/nvcc")
    cu = [[nvcc, "-std=c++20", "-DOPFORGE_WITH_CUDA=1", *flags, "--generate-code=arch=compute_80,code=sm_80",
           "-x", "cu", "-c", str(p), "-o", "/dev/null"]
          for p in sorted((checkout / "ops").glob(f"{name}*/*.cu"))] if nvcc else []
    return cc + cu


def test_generated_sources_compile(checkout):
    new_op("scale_by", checkout)
    commands = compile_commands(checkout, "scale_by")
    # Two declarations and two CPU kernels, and the two CUDA kernels where nvcc is installed.
    assert len(commands) == (6 if any("nvcc" in c[0] for c in commands) else 4)
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{' '.join(command)}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("name, message", [
    ("ScaleBy", "'name' must be lowercase letters, digits and underscores, starting with a letter, got 'ScaleBy'"),
    ("2x", "got '2x'"),
    ("scale-by", "got 'scale-by'"),
    ("class", "'name' must not be a Python keyword, got 'class'"),
    ("grad_backward", "must not end in '_backward'"),
    ("x" * 49, "'name' must be at most 48 characters, got 49"),
    ("add_one", "ops/add_one already exists"),
    ("rms_norm", "'name' 'rms_norm' is already an op or an attribute of the opforge module"),
    ("info", "'name' 'info' is already an op or an attribute of the opforge module"),
    ("jax", "'name' 'jax' is already an op or an attribute of the opforge module"),  # a submodule
])
def test_refuses_names_it_cannot_use(checkout, capsys, name, message):
    assert main(["new-op", name, "--root", str(checkout)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("opforge new-op: ") and message in err, err
    assert sorted(p.name for p in (checkout / "ops").iterdir()) == ["add_one", "add_one_backward"]


def test_outside_a_checkout_it_uses_the_installed_template(tmp_path, capsys):
    assert main(["new-op", "scale_by", "--root", str(tmp_path / "my_ops")]) == 0
    assert written_names(tmp_path / "my_ops", "scale_by") == sorted(
        [f"ops/scale_by/{f.format(n='scale_by')}" for f in FILES] +
        [f"ops/scale_by_backward/{f.format(n='scale_by_backward')}" for f in FILES])
    assert "OPFORGE_OP(scale_by)" in (tmp_path / "my_ops/ops/scale_by/scale_by.cc").read_text()
    out = capsys.readouterr().out
    assert f"export OPFORGE_PLUGINS=$(opforge build-plugin {tmp_path}/my_ops/ops/scale_by " in out  # no checkout


def test_refuses_when_no_template_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(scaffold, "PACKAGED_TEMPLATES", tmp_path / "nothing")
    with pytest.raises(ScaffoldError, match=r"new-op: no template: neither .*ops/add_one nor .*nothing/add_one"):
        new_op("scale_by", tmp_path)
    assert not (tmp_path / "ops").exists()


def test_the_reserved_submodule_names_are_opforges_submodules():
    # import opforge and new-op refuse ops named like these; a new submodule must join the list.
    import pkgutil

    import opforge

    found = {m.name for m in pkgutil.iter_modules(opforge.__path__) if m.name[0].isalpha() and not m.name.startswith("lib")}
    assert found == opforge._SUBMODULES
