"""Every user error is a typed Python exception naming the op, the argument, what was expected
and what was got; none of them may take the interpreter down."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import opforge

# Tests that force the cuda backend onto CPU arrays need it compiled (a build without nvcc has
# only the cpu backend; there, forcing "cuda" is an unknown-backend error, tested elsewhere).
WITH_CUDA_BACKEND = pytest.mark.skipif(not any(b["name"] == "cuda" for b in opforge._core.backends()),
                                       reason="opforge was built without CUDA")

X = np.ones((2, 3), np.float32)
W = np.ones(3, np.float32)


@pytest.fixture
def restore_backend():
    yield
    for op in [None] + opforge._core.op_names():
        opforge.set_backend(None, op)


USER_ERRORS = [
    # dtypes
    (lambda: opforge.add_one(X.astype(np.int8)), TypeError,
     r"add_one\(\): 'x' must have dtype in \[float32, float64, float16, bfloat16, int32, int64\], got int8"),
    (lambda: opforge.rms_norm(X.astype(np.int32), W), TypeError,
     r"rms_norm\(\): 'x' must have dtype in \[float32, float64, float16, bfloat16\], got int32"),
    (lambda: opforge.add(X, X.astype(np.float64)), TypeError,
     r"add\(\): 'y' must have dtype float32 like 'x', got float64"),
    (lambda: opforge.rms_norm(X, W.astype(np.float16)), TypeError,
     r"rms_norm\(\): 'weight' must have dtype float32 like 'x', got float16"),
    (lambda: opforge.add(torch.ones(3), torch.ones(3, dtype=torch.bfloat16)), TypeError,
     r"add\(\): 'y' must have dtype float32 like 'x', got bfloat16"),
    # shapes and ranks
    (lambda: opforge.rms_norm(X, np.ones(4, np.float32)), ValueError,
     r"rms_norm\(\): 'weight' must have shape \[3\], got \[4\]"),
    (lambda: opforge.rms_norm(np.float32(1.0).reshape(()), W), ValueError,
     r"rms_norm\(\): 'x' must have rank >= 1, got rank 0 \(shape \[\]\)"),
    (lambda: opforge.rms_norm(X, W.reshape(1, 3)), ValueError,
     r"rms_norm\(\): 'weight' must have rank 1, got rank 2 \(shape \[1, 3\]\)"),
    (lambda: opforge.add(X, np.ones(4, np.float32)), ValueError,
     r"add\(\): 'x' of shape \[2, 3\] and 'y' of shape \[4\] cannot be broadcast together"),
    (lambda: opforge.add(np.ones((2, 1, 3)), np.ones((4, 2))), ValueError,
     r"add\(\): 'x' of shape \[2, 1, 3\] and 'y' of shape \[4, 2\] cannot be broadcast"),
    # non-arrays: no implicit conversion of lists or Python numbers
    (lambda: opforge.add([1.0, 2.0], X), TypeError, r"add\(\): 'x' must be an array .*, got list"),
    (lambda: opforge.add(X, 1.0), TypeError, r"add\(\): 'y' must be an array .*, got float"),
    (lambda: opforge.add_one("abc"), TypeError, r"add_one\(\): 'x' must be an array .*, got str"),
    (lambda: opforge.add(None, X), TypeError, r"add\(\): 'x' must be an array, got NoneType"),
    # arrays this path cannot read in place: dtypes outside DLPack's set, byte order, devices
    (lambda: opforge.add_one(X.astype(np.complex64)), TypeError, r"add_one\(\): 'x' must have dtype in \[float32, .*\], got complex64$"),
    (lambda: opforge.add_one(X.astype(">f4")), TypeError,
     r"add_one\(\): 'x' is a ndarray with dtype >f4 on cpu, which opforge cannot read without a copy"),
    # (torch tensors alone go to opforge.torch, tested in test_torch and test_routes; mixed with
    # a NumPy array, they take the generic path tested here)
    (lambda: opforge.add(torch.ones(3, device="meta"), W), TypeError,
     r"add\(\): 'x' is a Tensor with dtype torch.float32 on meta"),
    # binding, like a Python signature
    (lambda: opforge.add(X), TypeError, r"add\(\) missing required argument 'y'"),
    (lambda: opforge.rms_norm(weight=W), TypeError, r"rms_norm\(\) missing required argument 'x'"),
    (lambda: opforge.add(X, X, X), TypeError, r"add\(\) takes 2 arguments but 3 were given"),
    (lambda: opforge.add(X, y=X, z=X), TypeError, r"add\(\) got an unexpected keyword argument 'z'"),
    (lambda: opforge.add(X, X, x=X), TypeError, r"add\(\) got multiple values for argument 'x'"),
    # attributes
    (lambda: opforge.rms_norm(X, W, eps="a"), TypeError, r"rms_norm\(\): 'eps' must be a float, got str"),
    (lambda: opforge.rms_norm(X, W, eps=True), TypeError, r"rms_norm\(\): 'eps' must be a float, got bool"),
    (lambda: opforge.rms_norm(X, W, eps=None), TypeError, r"rms_norm\(\): 'eps' must be a float, got NoneType"),
    (lambda: opforge.rms_norm(X, W, eps=-1e-3), ValueError, r"rms_norm\(\): 'eps' must be >= 0, got -0.001"),
    (lambda: opforge.rms_norm(X, W, eps=float("nan")), ValueError, r"rms_norm\(\): 'eps' must be >= 0, got nan"),
    # an array is a number to Python's C API, but not a float; ints must fit in 64 bits
    (lambda: opforge.rms_norm(X, W, eps=W), TypeError, r"rms_norm\(\): 'eps' must be a float, got ndarray"),
    (lambda: opforge.rms_norm(X, W, eps=10**400), ValueError, r"rms_norm\(\): 'eps' is out of the float range"),
    (lambda: opforge.scatter_add(X, np.zeros(2, np.int64), 2.0), TypeError,
     r"scatter_add\(\): 'dim_size' must be an int, got float"),
    (lambda: opforge.scatter_add(X, np.zeros(2, np.int64), np.array([2])), TypeError,
     r"scatter_add\(\): 'dim_size' must be an int, got ndarray"),
    (lambda: opforge.scatter_add(X, np.zeros(2, np.int64), 2**70), ValueError,
     r"scatter_add\(\): 'dim_size' must fit in 64 bits, got 1180591620717411303424"),
    (lambda: opforge.scatter_add(X, np.zeros(2, np.int64), 2, dim=2**63), ValueError,
     r"scatter_add\(\): 'dim' must fit in 64 bits, got 9223372036854775808"),
    (lambda: opforge.rms_norm(X, W, eps=1j), TypeError, r"rms_norm\(\): 'eps' must be a float, got complex"),
    (lambda: opforge.gelu(X, approximate="\udcff"), ValueError,
     r"gelu\(\): 'approximate' is not valid Unicode text \(it has a lone surrogate\)"),
    # results too big to address, or to allocate: the op's error, not a crash or a bare one
    (lambda: opforge.relu(torch.ones(1).expand(2**31, 2**31)), ValueError,
     r"relu\(\): the result would have shape \[2147483648, 2147483648\] \(float32\), 2\^63 bytes or more"),
    (lambda: opforge.scatter_add(X, np.zeros(2, np.int64), 2**62), ValueError,
     r"scatter_add\(\): the result would have shape \[4611686018427387904, 3\]"),
    (lambda: opforge.relu(np.broadcast_to(np.float32(1), (2**46,))), RuntimeError,
     r"relu\(\): cannot allocate its results: cpu backend: out of memory allocating 281474976710656 bytes"),
    # torch's lazy negation and conjugation bits: the exported memory does not carry them
    (lambda: opforge.add(torch.randn(2, 3, dtype=torch.complex64).conj().imag, W), TypeError,
     r"add\(\): 'x' is a torch tensor with its negative bit set \(a lazy negation\); call \.resolve_neg\(\) first"),
    # torch autograd is opforge.torch's job; the generic path must not drop gradients
    (lambda: opforge.add(torch.ones(3, requires_grad=True), W), TypeError,
     r"add\(\): 'x' is a torch tensor that requires grad; the DLPack path that arrays of mixed kinds take "
     r"carries no autograd: call \.detach\(\) first, or pass torch tensors only \(then opforge\.torch\.add runs, "
     r"with autograd\)$"),
    (lambda: opforge.rms_norm(X, torch.ones(3, requires_grad=True)), TypeError,
     r"rms_norm\(\): 'weight' is a torch tensor that requires grad"),
    # global settings
    (lambda: opforge._core.op("nope"), ValueError, r"unknown op 'nope' \(known ops: add, .*add_one, .*rms_norm"),
    (lambda: opforge.set_backend("nope"), ValueError, r"unknown backend 'nope' \(known: cpu"),
    (lambda: opforge.set_backend("cpu", "nope"), ValueError, r"set_backend\(\) names unknown op 'nope'"),
    (lambda: opforge.set_num_threads(0), ValueError, r"set_num_threads\(\): 'n' must be >= 1, got 0"),
    (lambda: opforge.set_simd_target("nope"), ValueError,
     r"set_simd_target\(\): 'name' must be one of the targets this CPU supports \[.*\], got 'nope'"),
]


@pytest.mark.parametrize("call, error, match", USER_ERRORS,
                         ids=[re.sub(r"\\", "", m)[:50] for _, _, m in USER_ERRORS])
def test_user_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_requires_grad_is_fine_without_grad_mode():
    # Under no_grad there is no gradient to lose (inference with nn.Parameter weights).
    with torch.no_grad():
        out = opforge.add(torch.ones(3, requires_grad=True), W)  # with NumPy: the generic path
    assert torch.equal(out, torch.full((3,), 2.0))


@WITH_CUDA_BACKEND
@pytest.mark.parametrize("op", [None, "add_one"])
def test_forced_backend_cannot_run_cpu_arrays(restore_backend, op):
    opforge.set_backend("cuda", op)
    with pytest.raises(RuntimeError, match=r"add_one\(\): backend 'cuda' \(forced by set_backend\(\)\) "
                                           r"cannot run on cpu tensors"):
        opforge.add_one(X)
    if op:  # a per-op override leaves the other ops alone
        np.testing.assert_array_equal(opforge.add(X, X), X + X)
    opforge.set_backend(None, op)
    np.testing.assert_array_equal(opforge.add_one(X), X + 1)


def run_python(code, **env):
    """Runs `code` in a fresh interpreter (config is read once per process) and returns its
    stdout; a crash (signal, abort) fails the test instead of killing pytest."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OPFORGE_")}
    full_env.update(env)
    proc = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


# Prints "ok" or "<ExceptionType>: <message>" for each call, one per line.
TRY = """
import numpy as np, opforge
def attempt(f):
    try:
        f()
        print("ok")
    except Exception as e:
        print(f"{type(e).__name__}: {e}")
x = np.ones(3, np.float32)
"""


@WITH_CUDA_BACKEND
def test_env_backend():
    out = run_python(TRY + "attempt(lambda: opforge.add_one(x))", OPFORGE_BACKEND="cuda")
    assert out.strip() == ("RuntimeError: add_one(): backend 'cuda' (forced by OPFORGE_BACKEND) "
                           "cannot run on cpu tensors")


def test_env_backend_unknown():
    out = run_python(TRY + "attempt(lambda: opforge.add_one(x))", OPFORGE_BACKEND="add_one=nope")
    assert out.startswith("ValueError: OPFORGE_BACKEND names unknown backend 'nope'")


@WITH_CUDA_BACKEND
def test_config_file_per_op(tmp_path):
    path = tmp_path / "opforge.json"
    path.write_text(json.dumps({"ops": {"add": "cuda"}}))
    out = run_python(TRY + "attempt(lambda: opforge.add(x, x))\nattempt(lambda: opforge.add_one(x))",
                     OPFORGE_CONFIG=str(path))
    add_line, add_one_line = out.splitlines()
    assert add_line == f"RuntimeError: add(): backend 'cuda' (forced by config file {path}) cannot run on cpu tensors"
    assert add_one_line == "ok"


@pytest.mark.parametrize("text, match", [
    ('{"ops": {"add": "cuda"},\n  "backend": }', r"invalid JSON: line 2, column \d+"),
    ('{"colour": "blue"}', r"unknown key 'colour' \(expected backend, ops, num_threads\)"),
    ('{"ops": {"nope": "cpu"}}', r"names unknown op 'nope'"),
    ('{"num_threads": 0}', r"'num_threads' must be a .*number"),
    ("[1, 2]", r"expected a JSON object, got array"),
], ids=["syntax", "unknown-key", "unknown-op", "threads", "not-object"])
def test_config_file_invalid(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_text(text)
    out = run_python(TRY + "attempt(lambda: opforge.add_one(x))", OPFORGE_CONFIG=str(path))
    assert out.startswith(f"ValueError: config file {path}"), out
    assert re.search(match, out), out


def test_config_file_missing(tmp_path):
    path = tmp_path / "absent.json"
    out = run_python(TRY + "attempt(lambda: opforge.add_one(x))", OPFORGE_CONFIG=str(path))
    assert out.strip() == f"ValueError: OPFORGE_CONFIG: cannot read {path}"


def test_env_num_threads():
    assert run_python("import opforge; print(opforge.num_threads())", OPFORGE_NUM_THREADS="1").strip() == "1"


def test_env_simd_target_invalid_does_not_abort():
    # A bad OPFORGE_SIMD is ignored at load (reported by `opforge info`), never an abort.
    out = run_python("import opforge; print(opforge.simd_target() in opforge.simd_targets())", OPFORGE_SIMD="nope")
    assert out.strip() == "True"


def test_numpy_and_torch_scalars_are_attributes():
    """Attributes take what float() and operator.index() take: NumPy and torch scalars too."""
    index = np.array([0, 1])
    want = opforge.scatter_add(X, index, 3)
    for dim_size in (np.int64(3), np.int32(3), np.uint8(3), torch.tensor(3)):
        np.testing.assert_array_equal(opforge.scatter_add(X, index, dim_size), want)
    want = opforge.rms_norm(X, W, 1e-3)
    for eps in (np.float32(1e-3), np.float64(1e-3), torch.tensor(1e-3, dtype=torch.float64), np.array(1e-3)):
        np.testing.assert_allclose(opforge.rms_norm(X, W, eps), want, rtol=1e-6)
    x, table = np.random.default_rng(0).standard_normal((2, 3, 2, 4)), np.ones((3, 2))
    np.testing.assert_array_equal(opforge.rope(x, table, table, np.bool_(True)), opforge.rope(x, table, table, True))
