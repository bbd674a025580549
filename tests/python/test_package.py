"""The Python package's surface: op listing, generated functions, settings round trips."""

import ast
import importlib.metadata
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opforge

OPS = [op["name"] for op in opforge.ops()]


def parse_schema(schema):
    """'rms_norm(Tensor x, Tensor weight, float eps=1e-6) -> Tensor' -> name, [(kind, arg, default)].
    Parsed here from the text, independently of the C++ schema parser."""
    m = re.fullmatch(r"(\w+)\((.*)\) -> (.+)", schema)
    assert m, schema
    args = []
    for item in filter(None, (s.strip() for s in m.group(2).split(","))):
        kind, rest = item.split(" ", 1)
        name, _, default = rest.partition("=")
        args.append((kind, name, default or None))
    return m.group(1), args


def test_ops_listed():
    assert {"add", "add_one", "rms_norm"} <= set(OPS)
    assert OPS == opforge._core.op_names()
    for op in opforge.ops():
        assert set(op) >= {"name", "schema", "doc", "args", "kernels"}
        assert op["schema"].startswith(op["name"] + "(")
        assert op["doc"]
        # Every dtype the declaration accepts must have a CPU kernel, or calls would fail late.
        cpu = [k for k in op["kernels"] if k["backend"] == "cpu"]
        assert len(cpu) == 1, op["kernels"]
        first_tensor = next(a for a in op["args"] if a["kind"].startswith("Tensor"))
        assert set(first_tensor["dtypes"]) <= set(cpu[0]["dtypes"])


@pytest.mark.parametrize("name", OPS)
def test_function_matches_schema(name):
    function = getattr(opforge, name)
    op = opforge._core.op(name)
    schema_name, args = parse_schema(op.schema)
    assert function.__name__ == schema_name == name
    *params, out = inspect.signature(function).parameters.values()
    assert (out.name, out.kind, out.default) == ("out", inspect.Parameter.KEYWORD_ONLY, None)
    assert [p.name for p in params] == [a for _, a, _ in args]
    for p, (kind, _, default) in zip(params, args):
        if default is None:
            assert p.default is inspect.Parameter.empty
        else:
            convert = {"float": float, "int": int, "bool": lambda s: s == "True",
                       "Tensor?": lambda s: None if s == "None" else s,
                       "str": lambda s: s.strip("'\"")}.get(kind, str)  # the schema quotes str defaults
            assert p.default == convert(default)
    assert op.schema in function.__doc__
    assert op.doc in function.__doc__


def test_namespace_holds_no_stray_names():
    """No public name of the package comes from its own imports: no `annotations` (the feature
    `from __future__ import annotations` binds), no module but opforge's own."""
    import __future__
    import types

    for name in (n for n in dir(opforge) if not n.startswith("_")):
        value = getattr(opforge, name)
        assert not isinstance(value, __future__._Feature), name
        assert not isinstance(value, types.ModuleType) or value.__name__.startswith("opforge."), name


def test_type_stub_is_current_and_parses():
    """python/opforge/__init__.pyi is what the generator makes of a fresh `import opforge` (no
    plugins: their ops are the stub's module __getattr__), and it is valid Python."""
    env = {k: v for k, v in os.environ.items() if k != "OPFORGE_PLUGINS"}
    code = "import opforge._stub, sys; sys.stdout.write(opforge._stub.stub_text())"
    fresh = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    stub = Path(__file__).parents[2] / "python" / "opforge" / "__init__.pyi"
    assert stub.read_text() == fresh, "regenerate: python -m opforge._stub"
    tree = ast.parse(fresh)
    declared = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert set(OPS) <= declared and {"info", "set_backend", "build_plugin", "PluginError"} <= declared
    add = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "add")
    assert [a.arg for a in add.args.kwonlyargs] == ["out"]


def test_function_binds_like_its_signature(rng):
    x = rng.standard_normal((2, 5))
    w = rng.standard_normal(5)
    want = opforge.rms_norm(x, w, 1e-3)
    for got in (opforge.rms_norm(x, weight=w, eps=1e-3), opforge.rms_norm(eps=1e-3, weight=w, x=x)):
        np.testing.assert_array_equal(got, want)


def test_info():
    info = opforge.info()
    assert set(info) >= {"version", "simd_compiled", "simd_supported", "simd_chosen", "amx", "backends",
                         "built_with_cuda", "num_threads", "ops"}
    for feature in ("amx", "bf16_convert", "bf16_dot"):
        assert info[feature] == {"supported": getattr(opforge, f"{feature}_supported")(),
                                 "enabled": getattr(opforge, f"{feature}_enabled")()}
    assert info["bf16_grad_rounding"] == opforge.bf16_grad_rounding_enabled()
    assert info["version"] == opforge.__version__ == importlib.metadata.version("opforge")
    assert info["ops"] == OPS
    assert info["num_threads"] == opforge.num_threads() >= 1
    cpu = next(b for b in info["backends"] if b["name"] == "cpu")
    assert cpu["available"] and cpu["device"] == "cpu"
    for b in info["backends"]:
        assert b["available"] or b["reason"], b  # an unavailable backend says why


@pytest.mark.parametrize("variable, feature", [("OPFORGE_AMX", "amx"), ("OPFORGE_BF16_CONVERT", "bf16_convert"),
                                               ("OPFORGE_BF16_DOT", "bf16_dot")])
def test_cpu_feature_environment_switch(variable, feature):
    """OPFORGE_AMX=0 (OPFORGE_BF16_CONVERT=0, OPFORGE_BF16_DOT=0) starts the process with AMX (the
    AVX512_BF16 stores, its dot products) off; by default each is on wherever supported."""
    code = f"import opforge; print(opforge.{feature}_enabled(), opforge.{feature}_supported())"
    run = lambda env: subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                     check=True).stdout.split()
    assert run(dict(os.environ, **{variable: "0"}))[0] == "False"
    enabled, supported = run({k: v for k, v in os.environ.items() if k != variable})
    assert enabled == supported


def test_bf16_grad_rounding_switch():
    """linear_act_backward keeps its bfloat16 g in float32 unless OPFORGE_BF16_GRAD_ROUNDING=1 or
    set_bf16_grad_rounding_enabled(True) says otherwise."""
    code = "import opforge; print(opforge.bf16_grad_rounding_enabled(), opforge.info()['bf16_grad_rounding'])"
    run = lambda env: subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                     check=True).stdout.split()
    unset = {k: v for k, v in os.environ.items() if k != "OPFORGE_BF16_GRAD_ROUNDING"}
    assert run(unset) == ["False", "False"]
    assert run(dict(unset, OPFORGE_BF16_GRAD_ROUNDING="1")) == ["True", "True"]
    assert run(dict(unset, OPFORGE_BF16_GRAD_ROUNDING="0")) == ["False", "False"]
    before = opforge.bf16_grad_rounding_enabled()
    try:
        opforge.set_bf16_grad_rounding_enabled(True)
        assert opforge.bf16_grad_rounding_enabled() and opforge.info()["bf16_grad_rounding"]
    finally:
        opforge.set_bf16_grad_rounding_enabled(before)


def test_bf16_convert_switch_keeps_the_bits():
    """set_bf16_convert_enabled turns the AVX512_BF16 stores on (where supported) and off, and the
    bits of a bfloat16 result do not change (tests/cpp/test_bf16_convert.cc holds them to the
    scalar rounding on every target)."""
    torch = pytest.importorskip("torch")
    import opforge.torch

    rng = np.random.default_rng(7)
    a = rng.standard_normal((64, 1000)).astype(np.float32)
    a[0, :4] = [1e-39, -3e-39, 3e38, np.nan]  # subnormal, overflowing and NaN products
    x, y = (torch.from_numpy(v).to(torch.bfloat16) for v in (a, rng.standard_normal((64, 1000))))
    before = opforge.bf16_convert_enabled()
    try:
        results = []
        for on in (False, True):
            opforge.set_bf16_convert_enabled(on)
            assert opforge.bf16_convert_enabled() == (on and opforge.bf16_convert_supported())
            results.append(opforge.torch.gelu(opforge.torch.mul(x, y)).view(torch.int16))
    finally:
        opforge.set_bf16_convert_enabled(before)
    assert torch.equal(results[0], results[1])
    want = torch.nn.functional.gelu((x.double() * y.double()).to(torch.bfloat16).double())
    torch.testing.assert_close(results[0].view(torch.bfloat16).double(), want, rtol=1e-2, atol=1e-6, equal_nan=True)


def cublaslt_status_with(setting):
    env = dict(os.environ, OPFORGE_CUBLASLT=setting)
    code = "import opforge; print(opforge.info()['cublaslt'])"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(not opforge._core.built_with_cuda, reason="cuBLASLt is part of the CUDA build")
def test_cublaslt_loader():
    """linear_act's CUDA forward loads cuBLASLt at run time (no GPU needed to load it): the status
    names the library and its version, or says why it is not used; OPFORGE_CUBLASLT=0 turns it
    off, a path names the file; set_cublaslt switches it for the process."""
    assert cublaslt_status_with("0") == "turned off by OPFORGE_CUBLASLT=0"
    missing = cublaslt_status_with("/nonexistent/libcublasLt.so.13")
    assert missing.startswith("/nonexistent/libcublasLt.so.13 not loaded ("), missing
    wheel = importlib.util.find_spec("nvidia.cu13")  # scripts/install.sh installs it for the header
    if wheel is None or "not built in" in opforge.info()["cublaslt"]:
        pytest.skip("no cuBLASLt wheel to load")
    path = os.path.join(list(wheel.submodule_search_locations)[0], "lib", "libcublasLt.so.13")
    loaded = cublaslt_status_with(path)
    assert re.fullmatch(r"cuBLASLt 13\.\d+\.\d+ \(" + re.escape(path) + r"\)", loaded), loaded
    # Not found at first use, then loaded by someone else (as `import torch` would): found then
    code = ("import ctypes, opforge; first = opforge.info()['cublaslt']; ctypes.CDLL(%r); "
            "print(first); print(opforge.info()['cublaslt'])" % path)
    env = {k: v for k, v in os.environ.items() if k != "OPFORGE_CUBLASLT"}
    first, then = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                 check=True).stdout.strip().splitlines()
    assert re.fullmatch(r"cuBLASLt 13\.\d+\.\d+ \(libcublasLt\.so\.13\)", then), (first, then)
    assert "not loaded" in first or first == then  # found at once where the loader's path has it
    before = opforge._core.set_cublaslt(False)
    try:
        assert opforge._core.set_cublaslt(False) is False
    finally:
        opforge._core.set_cublaslt(before)


def test_simd_targets():
    supported = opforge.simd_targets()
    assert supported and set(supported) <= set(opforge.simd_targets_compiled())
    try:
        for target in supported:
            opforge.set_simd_target(target)
            assert opforge.simd_target() == target
    finally:
        opforge.set_simd_target("")
    assert opforge.simd_target() == supported[0]  # automatic choice: the best target


def test_num_threads_round_trip():
    before = opforge.num_threads()
    try:
        for n in (1, 3, before):
            opforge.set_num_threads(n)
            assert opforge.num_threads() == n
    finally:
        opforge.set_num_threads(before)


@pytest.mark.parametrize("name", ["add", "add_one", "rms_norm"])
def test_results_independent_of_thread_count(simd_target, rng, name):
    # Work is split by rows or element ranges, never by partial sums, so the split may not
    # change a single bit.
    x = rng.standard_normal((512, 2048)).astype(np.float32)
    args = {"add": (x, x[0]), "add_one": (x,), "rms_norm": (x, x[1])}[name]
    before = opforge.num_threads()
    try:
        results = []
        for n in (1, 2):
            opforge.set_num_threads(n)
            results.append(getattr(opforge, name)(*args))
    finally:
        opforge.set_num_threads(before)
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.skipif(importlib.util.find_spec("opforge.cli") is None, reason="opforge.cli not written yet")
def test_console_script():
    (script,) = importlib.metadata.entry_points(group="console_scripts", name="opforge")
    assert script.value == "opforge.cli:main"
    assert callable(script.load())


@pytest.mark.skipif(importlib.util.find_spec("opforge.cli") is None, reason="opforge.cli not written yet")
def test_cli_info_says_whether_amx_is_used(capsys):
    from opforge.cli import main

    before = opforge.amx_enabled()
    try:
        opforge.set_amx_enabled(False)
        assert main(["info"]) == 0
        off = capsys.readouterr().out
        opforge.set_amx_enabled(True)
        assert main(["info"]) == 0
        on = capsys.readouterr().out
    finally:
        opforge.set_amx_enabled(before)
    if opforge.amx_supported():
        assert "AMX (bfloat16 tiles): off\n" in off and "AMX (bfloat16 tiles): on\n" in on
    else:
        assert "AMX (bfloat16 tiles): not supported\n" in off and "AMX (bfloat16 tiles): not supported\n" in on


# Symbols only the C++ runtime and the CUDA runtime define: a library of opforge's exporting one
# carries a static copy of that runtime. Torch's shared libstdc++ then takes over some calls of
# that copy, and the first error message that formats a number crashes (seen with a compiler that
# links libstdc++ statically: CMakeLists.txt hides static archives' symbols for that reason).
RUNTIME_SYMBOLS = ("_ZNSt6locale", "_ZNSo9_M_insert", "__cxa_allocate_exception", "__gxx_personality_v0",
                   "cudaMalloc", "cudaLaunchKernel")


def test_libraries_export_no_static_runtime():
    import shutil
    import subprocess
    from pathlib import Path

    if not shutil.which("nm"):
        pytest.skip("nm (binutils) is not installed")
    libraries = sorted(Path(opforge.__file__).parent.glob("*.so"))
    assert any(p.name == "libopforge.so" for p in libraries)
    for library in libraries:
        out = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
        exported = [line.split()[-1] for line in out.stdout.splitlines() if line.strip()]
        leaked = [s for s in exported if s.startswith(RUNTIME_SYMBOLS)]
        assert not leaked, f"{library.name} exports {len(leaked)} runtime symbols, e.g. {leaked[:3]}"


def test_error_messages_after_torch_loads():
    """The numbers in a validation message format the same once torch's libraries are loaded."""
    import subprocess
    import sys

    code = ("import numpy as np, opforge, torch\n"
            "try:\n    opforge.rms_norm(np.ones((2, 4), np.float32), np.ones(3, np.float32))\n"
            "except ValueError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "rms_norm(): 'weight' must have shape [4], got [3]"
