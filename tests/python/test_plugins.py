"""Ops compiled apart from opforge's build: `opforge new-op` writes an op, the test edits its
kernel, `build_plugin` compiles it, and a new process with OPFORGE_PLUGINS uses it from NumPy,
torch (autograd, torch.compile) and JAX (jit, grad, vmap), with the same errors as a built-in
op; `opforge.load_plugin` does the same in a running process, whichever frontends it has
imported. Then the failures: compiler errors, a duplicate op, a library that does not load, a
plugin adding kernels to an op it did not declare."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import opforge
from opforge.plugins import PluginError, build_plugin
from opforge.scaffold import new_op

REPO = Path(__file__).resolve().parents[2]


def run_with_plugins(code, *plugins):
    env = {**os.environ, "OPFORGE_PLUGINS": os.pathsep.join(map(str, plugins))}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def plus_two(tmp_path_factory):
    """A plugin op, plus_two(x) = x + 2 (and its backward), built once for the module."""
    root = tmp_path_factory.mktemp("checkout")
    for folder in ("add_one", "add_one_backward"):
        (root / "ops" / folder).mkdir(parents=True)
        for f in (REPO / "ops" / folder).iterdir():
            (root / "ops" / folder / f.name).write_bytes(f.read_bytes())
    new_op("plus_two", root)
    kernel = root / "ops/plus_two/plus_two_cpu.cc"
    text = kernel.read_text()
    assert "hn::Set(d, 1)" in text and "v + C(1)" in text
    kernel.write_text(text.replace("hn::Set(d, 1)", "hn::Set(d, 2)").replace("v + C(1)", "v + C(2)"))
    # The CUDA kernel too: it is compiled where opforge has CUDA, and JAX's arrays are on the GPU there.
    cuda_kernel = root / "ops/plus_two/plus_two_cuda.cu"
    text = cuda_kernel.read_text()
    assert text.count("A(1)") == 1 and text.count("cuda::Acc<T>(1)") == 1
    cuda_kernel.write_text(text.replace("A(1)", "A(2)").replace("cuda::Acc<T>(1)", "cuda::Acc<T>(2)"))
    ref = root / "ops/plus_two/reference.py"
    assert ref.read_text().count("return x + 1") == 3
    ref.write_text(ref.read_text().replace("return x + 1", "return x + 2"))
    cache = tmp_path_factory.mktemp("cache")
    os.environ["OPFORGE_CACHE_DIR"] = str(cache)
    try:
        path = build_plugin([root / "ops/plus_two", root / "ops/plus_two_backward"])
    finally:
        del os.environ["OPFORGE_CACHE_DIR"]
    return root, cache, path


# Every frontend runs plus_two (opforge, torch, jax and the rest imported by the code before it).
CHECK_PLUS_TWO = """
x = np.arange(5.0, dtype=np.float32)
assert opforge.loaded_plugins and "plus_two" in [o["name"] for o in opforge.ops()]
assert opforge.info()["plugins"] == opforge.loaded_plugins
np.testing.assert_array_equal(opforge.plus_two(x), x + 2)
t = torch.arange(5.0, requires_grad=True)
y = torch.ops.opforge.plus_two(t)
y.sum().backward()
assert torch.equal(y.detach(), t.detach() + 2) and torch.equal(t.grad, torch.ones(5))
assert torch.equal(torch.compile(lambda a: ot.plus_two(a) * 3, fullgraph=True)(t.detach()), (t.detach() + 2) * 3)
t = torch.arange(5.0, requires_grad=True)  # opforge.<op> on torch tensors: opforge.torch's
opforge.plus_two(t).sum().backward()
assert torch.equal(t.grad, torch.ones(5))
assert torch.equal(torch.compile(lambda a: opforge.plus_two(a) * 3, fullgraph=True)(t.detach()), (t.detach() + 2) * 3)
o = torch.empty(5)  # its out variant, eager and compiled
assert opforge.plus_two(torch.zeros(5), out=o) is o and torch.equal(o, torch.full((5,), 2.0))
torch.compile(lambda a, b: ot.plus_two(a, out=b), fullgraph=True)(torch.ones(5), o)
assert torch.equal(o, torch.full((5,), 3.0))
j = jnp.arange(5.0)
assert jnp.array_equal(jax.jit(oj.plus_two)(j), j + 2)
assert jnp.array_equal(jax.jit(opforge.plus_two)(j), j + 2)  # a tracer: opforge.jax's
assert jnp.array_equal(jax.grad(lambda a: oj.plus_two(a).sum())(j), jnp.ones(5))
assert jnp.array_equal(jax.vmap(oj.plus_two)(j[None]), (j + 2)[None])
try:
    opforge.plus_two(x.astype(np.int8))
except TypeError as e:
    assert "plus_two(): 'x' must have dtype in" in str(e), e
else:
    raise AssertionError("int8 accepted")
import opforge.references.plus_two as ref
np.testing.assert_array_equal(ref.numpy(x), x + 2)  # the plugin's reference.py, kept beside it
for target in opforge.simd_targets():
    opforge.set_simd_target(target)
    np.testing.assert_array_equal(opforge.plus_two(np.arange(37.0)), np.arange(37.0) + 2)
opforge.set_simd_target("")
"""
IMPORT_ALL = "import numpy as np, torch, jax, jax.numpy as jnp, opforge, opforge.torch as ot, opforge.jax as oj\n"


def test_plugin_op_runs_in_every_framework(plus_two):
    _, _, path = plus_two
    out = run_with_plugins(IMPORT_ALL + CHECK_PLUS_TWO + "print('ok')", path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-4000:]


def run_python(code, **env):
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, "OPFORGE_PLUGINS": "", **env},
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("native", ["1", "0"], ids=["cxx_autograd", "python_autograd"])
def test_load_plugin_after_every_frontend_imported(plus_two, native):
    """A notebook's case: torch (dynamo too), the forge device and JAX are in use when the op is loaded."""
    _, _, path = plus_two
    forge = "import opforge.forge\n" if (Path(opforge.__file__).parent / "libopforge_forge.so").exists() else ""
    code = (IMPORT_ALL + "import torch._dynamo\n" + forge + "assert not hasattr(opforge, 'plus_two') and not hasattr(ot, 'plus_two')\n"
            f"assert opforge.load_plugin({str(path)!r}) == ['plus_two', 'plus_two_backward']\n"
            f"assert opforge.load_plugin({str(path)!r}) == []  # again: nothing new\n" + CHECK_PLUS_TWO +
            "assert torch.equal(ot.plus_two(torch.ones(3)), torch.full((3,), 3.0))\n"
            "if 'opforge.forge' in __import__('sys').modules:\n"
            "    assert torch.equal(ot.plus_two(torch.ones(3, device='forge')).cpu(), torch.full((3,), 3.0))\n"
            "    o = torch.empty(3, device='forge')\n"
            "    assert ot.plus_two(torch.ones(3, device='forge'), out=o) is o and torch.equal(o.cpu(), torch.full((3,), 3.0))\n"
            "print('ok')")
    out = run_python(code, OPFORGE_TORCH_NATIVE=native)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-4000:]


def test_load_plugin_before_the_frameworks_import(plus_two):
    _, _, path = plus_two
    code = (f"import opforge\nopforge.load_plugin({str(path)!r})\n"
            "import numpy as np, torch, jax, jax.numpy as jnp, opforge.torch as ot, opforge.jax as oj\n"
            + CHECK_PLUS_TWO + "print('ok')")
    out = run_python(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-4000:]


def test_load_plugin_while_other_threads_run_ops(plus_two):
    """The registry grows under a lock: threads calling ops meanwhile see whole tables."""
    _, _, path = plus_two
    code = f"""
import threading, numpy as np, opforge
stop, failures = False, []
def work():
    x = np.arange(1000.0)
    while not stop:
        try:
            np.testing.assert_array_equal(opforge.add_one(x), x + 1)
        except Exception as e:
            failures.append(e)
threads = [threading.Thread(target=work) for _ in range(4)]
[t.start() for t in threads]
opforge.load_plugin({str(path)!r})
np.testing.assert_array_equal(opforge.plus_two(np.ones(3)), np.full(3, 3.0))
stop = True
[t.join() for t in threads]
assert not failures, failures
print('ok')
"""
    out = run_python(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-4000:]


def test_load_plugin_refuses_a_changed_op(plus_two, tmp_path):
    """An op cannot be replaced in a running process; the one loaded first keeps working."""
    root, _, path = plus_two
    kernel = root / "ops/plus_two/plus_two_cpu.cc"
    original = kernel.read_text()
    try:
        kernel.write_text(original.replace("hn::Set(d, 2)", "hn::Set(d, 5)").replace("v + C(2)", "v + C(5)"))
        changed = build_plugin([root / "ops/plus_two", root / "ops/plus_two_backward"], tmp_path / "changed.so")
    finally:
        kernel.write_text(original)
    code = f"""
import numpy as np, opforge
opforge.load_plugin({str(path)!r})
try:
    opforge.load_plugin({str(changed)!r})
except opforge.PluginError as e:
    assert "op 'plus_two'" in str(e) and "declared twice" in str(e) and "cannot be replaced" in str(e), e
else:
    raise AssertionError("a second plus_two loaded")
np.testing.assert_array_equal(opforge.plus_two(np.arange(40.0)), np.arange(40.0) + 2)
print('ok')
"""
    out = run_python(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-4000:]


def has_cuda_kernels(library: Path) -> bool:
    """Whether the library carries compiled CUDA kernels (nvcc's fatbinary section)."""
    sections = subprocess.run(["readelf", "-S", "-W", str(library)], capture_output=True, text=True, check=True)
    return ".nv_fatbin" in sections.stdout


def can_compile_cuda() -> bool:
    from opforge.plugins import _Cuda

    return _Cuda.find() is not None


@pytest.mark.skipif(not opforge._core.built_with_cuda, reason="opforge was built without CUDA")
def test_a_plugin_compiles_its_cuda_kernels(plus_two):
    """The scaffold's _cuda.cu files are compiled for this build's architectures and registered."""
    if not can_compile_cuda():
        pytest.skip("no nvcc")
    _, _, path = plus_two
    assert has_cuda_kernels(path)
    code = ("import opforge\nprint(sorted(k['backend'] for o in opforge.ops() if o['name'] in "
            "('plus_two', 'plus_two_backward') for k in o['kernels']))")
    out = run_with_plugins(code, path)
    assert out.returncode == 0 and out.stdout.strip() == str(["cpu", "cpu", "cuda", "cuda"]), out.stderr[-2000:]


def test_without_nvcc_the_plugin_has_cpu_kernels_and_a_warning(plus_two, tmp_path, monkeypatch):
    import shutil

    root, _, _ = plus_two
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if "nvcc" in name else which(name, *a, **k))
    monkeypatch.setenv("CUDACXX", "/somewhere/nvcc")
    expected = "no nvcc found" if opforge._core.built_with_cuda else "opforge was built without CUDA"
    with pytest.warns(UserWarning, match=f"built without its CUDA kernels \\(.cu files\\): {expected}"):
        path = build_plugin([root / "ops/plus_two"], tmp_path / "cpu_only.so")
    assert not has_cuda_kernels(path)


def test_a_plugin_op_on_cuda_tensors(plus_two):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or not can_compile_cuda():
        pytest.skip("needs a CUDA device and nvcc")
    _, _, path = plus_two
    code = """
import torch, opforge, opforge.torch as ot
x = torch.randn(1000, device="cuda", requires_grad=True)
y = ot.plus_two(x)
y.sum().backward()
assert y.device.type == "cuda" and torch.equal(y.detach(), x.detach() + 2) and torch.equal(x.grad, torch.ones_like(x))
print("ok")
"""
    out = run_with_plugins(code, path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-4000:]


def test_load_plugin_errors(tmp_path):
    with pytest.raises(PluginError, match=f"load_plugin\\(\\): cannot load {tmp_path / 'nowhere.so'}"):
        opforge.load_plugin(tmp_path / "nowhere.so")


SNEAKY = """#include "opforge/registry.h"
OPFORGE_OP(sneaky) {
  return opforge::OpDef("sneaky(Tensor x) -> Tensor").shape([](const opforge::ShapeContext& c) {
    return opforge::Outputs{c.like("x")}; });
}
static void zero(const opforge::KernelCall&) {}
OPFORGE_KERNEL(%s, "cpu", {opforge::DType::float32}, zero);
"""


@pytest.mark.parametrize("target, message", [
    ("add_one", "a cpu kernel for op 'add_one' comes from a library loaded after the op: a plugin may add kernels "
                "only to the ops it declares"),
    ("nobody", "a kernel is registered for op 'nobody', which no OPFORGE_OP declares"),
])
def test_a_plugin_may_add_kernels_only_to_its_own_ops(tmp_path, target, message):
    folder = tmp_path / "ops" / "sneaky"
    folder.mkdir(parents=True)
    (folder / "sneaky.cc").write_text(SNEAKY % target)
    path = build_plugin(folder, tmp_path / "sneaky.so")
    out = run_with_plugins("import opforge", path)
    assert out.returncode != 0 and "ImportError: opforge: some ops failed to register" in out.stderr
    assert message in out.stderr, out.stderr[-2000:]
    code = f"""
import numpy as np, opforge
try:
    opforge.load_plugin({str(path)!r})
except opforge.PluginError as e:
    assert {message!r} in str(e), e
else:
    raise AssertionError("loaded")
np.testing.assert_array_equal(opforge.add_one(np.arange(40.0, dtype=np.float32)), np.arange(40.0) + 1)
print('ok')
"""
    out = run_python(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-4000:]


# Ops whose backward, saving forward or identity gradient declarations are wrong, one mistake
# each (no kernels: the checks are on declarations). OP(name, schema, extra declaration calls).
BAD_GRADIENTS = """#include "opforge/registry.h"
#define OP(NAME, SCHEMA, ...) OPFORGE_OP(NAME) { return opforge::OpDef(SCHEMA) __VA_ARGS__ \\
    .shape([](const opforge::ShapeContext& c) { return opforge::Outputs(c.op().schema().num_results, c.like("x")); }); }
OP(g_bwd, "g_bwd(Tensor grad, Tensor x, Tensor? z=None) -> Tensor")
OP(g_strict_bwd, "g_strict_bwd(Tensor grad, Tensor z) -> Tensor")
OP(g_save, "g_save(Tensor x) -> (Tensor, Tensor)")
OP(g_no_op, "g_no_op(Tensor x) -> Tensor", .backward("g_bwd", {"x"}).saving_forward("g_missing", {"z"}))
OP(g_other_args, "g_other_args(Tensor x, float eps=1.0) -> Tensor", .backward("g_bwd", {"x"}).saving_forward("g_save", {"z"}))
OP(g_one_result, "g_one_result(Tensor x) -> Tensor", .backward("g_bwd", {"x"}).saving_forward("g_bwd_like", {"z"}))
OP(g_bwd_like, "g_bwd_like(Tensor x) -> Tensor")
OP(g_required, "g_required(Tensor x) -> Tensor", .backward("g_strict_bwd", {"x"}).saving_forward("g_save", {"z"}))
OP(g_unused, "g_unused(Tensor x) -> Tensor", .saving_forward("g_save", {"z"}))
OP(g_unknown_arg, "g_unknown_arg(Tensor x) -> Tensor", .backward("g_bwd", {"x"}))
OP(g_no_bwd, "g_no_bwd(Tensor x) -> Tensor", .backward("g_nowhere", {"x"}))
OP(g_named_x, "g_named_x(Tensor x) -> Tensor", .backward("g_bwd", {"x"}).saving_forward("g_save", {"x"}))
OP(g_two, "g_two(Tensor x) -> (Tensor, Tensor)", .backward("g_bwd", {"x"}).saving_forward("g_save", {"z"}))
OP(g_empty, "g_empty(Tensor x) -> Tensor", .backward("g_bwd", {"x"}).saving_forward("g_save", {}))
OP(g_id_nondiff, "g_id_nondiff(Tensor x, Tensor y) -> Tensor", .backward("g_bwd", {"x"}).identity_gradient({"y"}))
OP(g_id_no_bwd, "g_id_no_bwd(Tensor x) -> Tensor", .identity_gradient({"x"}))
OP(g_id_two, "g_id_two(Tensor x) -> (Tensor, Tensor)", .backward("g_bwd", {"x"}).identity_gradient({"x"}))
OP(g_id_empty, "g_id_empty(Tensor x) -> Tensor", .backward("g_bwd", {"x"}).identity_gradient({}))
OP(g_mask_float, "g_mask_float(Tensor grad, float output_mask=-1) -> Tensor")
OP(g_mask_all_off, "g_mask_all_off(Tensor grad, int output_mask=0) -> Tensor")
OP(g_mask_required, "g_mask_required(Tensor grad, int output_mask) -> Tensor")
"""


def test_bad_gradient_declarations_fail_the_import(tmp_path):
    folder = tmp_path / "ops" / "bad_gradients"
    folder.mkdir(parents=True)
    (folder / "bad_gradients.cc").write_text(BAD_GRADIENTS)
    out = run_with_plugins("import opforge", build_plugin(folder, tmp_path / "bad.so"))
    assert out.returncode != 0 and "ImportError: opforge: some ops failed to register" in out.stderr
    for message in [
        "op 'g_no_op': saving forward 'g_missing' is not registered",
        "op 'g_other_args': saving forward 'g_save' must take the same arguments as 'g_other_args'",
        "op 'g_one_result': saving forward 'g_bwd_like' must return 2 results (the result of 'g_one_result', then "
        "one per saved name), not 1",
        "op 'g_required': backward op 'g_strict_bwd' must take saved 'z' as 'Tensor? z=None'",
        "op 'g_unused': saving forward 'g_save' is declared without a backward op to use what it saves",
        "op 'g_unknown_arg': backward op 'g_bwd' takes 'z', which is neither 'grad', 'result', 'output_mask', an "
        "argument of 'g_unknown_arg' nor a result its saving forward saves",
        "op 'g_no_bwd': backward op 'g_nowhere' is not registered",
        "op 'g_named_x': g_named_x(): saved result 'x' is named like 'grad', 'result' or an argument",
        "op 'g_two': saving forward 'g_save': only an op with one result can have one",
        "op 'g_empty': g_empty(): saving_forward('g_save') names no saved results",
        "op 'g_id_nondiff': identity gradient of 'y', which its backward op 'g_bwd' does not differentiate",
        "op 'g_id_no_bwd': an identity gradient is declared without a backward op",
        "op 'g_id_two': an identity gradient needs an op with one result",
        "op 'g_id_empty': g_id_empty(): identity_gradient() names no inputs",
        *(f"op '{name}': {name}(): 'output_mask' must be declared 'int output_mask=-1' (every result by default)"
          for name in ("g_mask_float", "g_mask_all_off", "g_mask_required")),
    ]:
        assert message in out.stderr, f"{message!r} not in:\n{out.stderr[-4000:]}"
    for fine in ("'g_bwd'", "'g_save'", "'g_bwd_like'", "'g_strict_bwd'"):
        assert f"op {fine}:" not in out.stderr  # correct declarations raise nothing


def test_the_tour_checks_plugin_ops_against_their_reference(plus_two):
    _, _, path = plus_two
    env = {**os.environ, "OPFORGE_PLUGINS": str(path)}
    out = subprocess.run([sys.executable, "-m", "opforge", "tour", "--frameworks", "numpy", "--repeats", "1",
                          "--rows", "8", "--cols", "64"], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("plus_two ")]
    assert rows and rows[0][:3] == ["plus_two", "numpy", "opforge"] and float(rows[0][5]) == 0.0, out.stdout[-2000:]


def test_an_unchanged_plugin_is_not_rebuilt(plus_two, monkeypatch):
    root, cache, path = plus_two
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(cache))
    before = path.stat().st_mtime_ns
    assert build_plugin([root / "ops/plus_two", root / "ops/plus_two_backward"]) == path
    assert path.stat().st_mtime_ns == before


def test_compiler_errors_name_the_file(plus_two, tmp_path):
    root, _, _ = plus_two
    broken = tmp_path / "ops" / "broken_op"
    broken.mkdir(parents=True)
    (broken / "broken_op.cc").write_text('#include "opforge/registry.h"\nOPFORGE_OP(broken_op) { return 42 }\n')
    with pytest.raises(PluginError, match=r"(?s)compiling .*broken_op\.cc failed .*error"):
        build_plugin(broken, tmp_path / "broken.so")


def test_bad_folders(tmp_path):
    with pytest.raises(PluginError, match="'folders' must be op folders, .* is not a directory"):
        build_plugin(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PluginError, match="has no declaration empty.cc"):
        build_plugin(tmp_path / "empty")
    with pytest.raises(PluginError, match="'folders' must name at least one op folder"):
        build_plugin([])
    (tmp_path / "a" / "same").mkdir(parents=True)
    (tmp_path / "b" / "same").mkdir(parents=True)
    with pytest.raises(PluginError, match=r"'folders' must have distinct names, got \['same', 'same'\]"):
        build_plugin([tmp_path / "a" / "same", tmp_path / "b" / "same"])


def test_a_missing_compiler(tmp_path, monkeypatch):
    folder = tmp_path / "ops" / "x"
    folder.mkdir(parents=True)
    (folder / "x.cc").write_text("")
    with pytest.raises(PluginError, match="no C\\+\\+ compiler found \\('/nonexistent/g\\+\\+' is not a program\\)"):
        build_plugin(folder, compiler="/nonexistent/g++")
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(PluginError, match="'no-such-compiler' is not a program"):
        build_plugin(folder)


def test_a_plugin_redeclaring_an_op_fails_the_import(tmp_path):
    dup = tmp_path / "ops" / "add_one"
    dup.mkdir(parents=True)
    (dup / "add_one.cc").write_text((REPO / "ops/add_one/add_one.cc").read_text().replace(
        '.backward("add_one_backward", {"x"})', ""))
    path = build_plugin(dup, tmp_path / "dup.so")
    out = run_with_plugins("import opforge", path)
    assert out.returncode != 0
    assert "ImportError: opforge: some ops failed to register" in out.stderr and "add_one" in out.stderr


def test_a_plugin_built_against_other_headers_is_refused(plus_two, tmp_path):
    _, _, path = plus_two
    copy = tmp_path / "old.so"
    copy.write_bytes(path.read_bytes())
    (tmp_path / "old.abi").write_text("0123456789abcdef\n")  # as if built by another opforge
    out = run_with_plugins("import opforge", copy)
    assert out.returncode != 0
    assert f"ImportError: opforge: OPFORGE_PLUGINS: {copy} was built against another opforge" in out.stderr
    (tmp_path / "old.abi").write_text(path.with_suffix(".abi").read_text())  # the right stamp: loads
    out = run_with_plugins("import numpy, opforge; print(opforge.plus_two(numpy.ones(1)))", copy)
    assert out.returncode == 0 and out.stdout.strip() == "[3.]", out.stderr[-2000:]


def test_an_op_named_like_an_opforge_attribute_fails_the_import(tmp_path):
    folder = tmp_path / "ops" / "info"
    folder.mkdir(parents=True)
    (folder / "info.cc").write_text('#include "opforge/registry.h"\n'
                                    'OPFORGE_OP(info) { return opforge::OpDef("info(Tensor x) -> Tensor")'
                                    '.shape([](const opforge::ShapeContext& c) { return opforge::Outputs{c.like("x")}; }); }\n')
    path = build_plugin(folder, tmp_path / "info.so")
    out = run_with_plugins("import opforge", path)
    assert out.returncode != 0 and "ImportError: opforge: op 'info' would replace opforge.info" in out.stderr, \
        out.stderr[-2000:]
    out = run_python(f"import opforge\nopforge.load_plugin({str(path)!r})")
    assert out.returncode != 0 and "PluginError: opforge: op 'info' would replace opforge.info" in out.stderr, \
        out.stderr[-2000:]


def test_a_library_that_does_not_load_is_an_import_error(tmp_path):
    out = run_with_plugins("import opforge", tmp_path / "nowhere.so")
    assert out.returncode != 0
    assert f"ImportError: opforge: OPFORGE_PLUGINS: cannot load {tmp_path / 'nowhere.so'}" in out.stderr


def test_cli_builds_and_prints_the_path(plus_two):
    root, cache, path = plus_two
    env = {**os.environ, "OPFORGE_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-m", "opforge", "build-plugin", str(root / "ops/plus_two"),
                          str(root / "ops/plus_two_backward")], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == str(path) and f"export OPFORGE_PLUGINS={path}" in out.stderr
    out = subprocess.run([sys.executable, "-m", "opforge", "build-plugin", str(root / "missing")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("opforge build_plugin(): 'folders' must be op folders")


def test_no_plugins_without_the_variable():
    if os.environ.get("OPFORGE_PLUGINS"):
        pytest.skip("OPFORGE_PLUGINS is set for this run")
    assert opforge.loaded_plugins == []
