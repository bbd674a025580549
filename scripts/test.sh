#!/usr/bin/env bash
# Runs every test: the C++ core tests (built by `scripts/install.sh --tests`), the same compiled
# for Arm under QEMU, pytest, and the GPU tests' CPU dry run.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -x build/ci/opforge_cpp_tests ]]; then
  echo "build/ci/opforge_cpp_tests is missing: run 'bash scripts/install.sh --tests' first" >&2
  exit 2
fi
ctest --test-dir build/ci --output-on-failure -j2
if [[ -x build/arm64/opforge_cpp_tests ]]; then
  ctest --test-dir build/arm64 --output-on-failure -j2
else
  echo "build/arm64 is missing (scripts/build_arm64.sh found no cross toolchain): Arm tests skipped" >&2
fi
if [[ -x build/arm64/python3 ]]; then
  # The Arm build of the Python module on an emulated aarch64 Python (no torch or jax there):
  # every op against its reference in the tour, and the NumPy cases of the op tests that import
  # without torch (the others take their references from torch).
  arm_python=(env PYTHONPATH=build/arm64/stage:build/arm64/site qemu-aarch64 -L / build/arm64/python3)
  "${arm_python[@]}" -m opforge tour --frameworks numpy --rows 64 --cols 256 --repeats 1
  "${arm_python[@]}" -m pytest -q -p no:cacheprovider -k "not torch and not jax" \
    ops/{add,add_one,mul,rms_norm,layer_norm,softmax,gelu,gelu_backward,silu,silu_backward,relu,relu_backward}/test_*.py \
    ops/{rope,scatter_add_backward,quantize_q4_0,quantize_q8_0,matmul_q}/test_*.py tests/python/test_output_mask_bits.py \
    tests/python/test_numpy_arrays.py
fi
# Two processes on two cores (pytest-xdist; a file's tests stay in one process, in order):
# ~35% less time than one (9 min -> under 6 on the 2-core CI machine), which is compile-,
# subprocess- and Python-bound. The thread pools then share the cores: tests assert no timings.
if python3 -c "import xdist" 2> /dev/null; then
  python3 -m pytest -n auto --maxprocesses 4 --dist loadfile
else
  python3 -m pytest
fi
# The GPU tests' own plumbing (samples, comparisons) on the CPU backend: a mistake there would
# otherwise surface only in the rare session with a GPU.
OPFORGE_TEST_DEVICE=cpu python3 -m pytest -q tests/python/test_cuda.py
