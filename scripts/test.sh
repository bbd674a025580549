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
python3 -m pytest
# The GPU tests' own plumbing (samples, comparisons) on the CPU backend: a mistake there would
# otherwise surface only in the rare session with a GPU.
OPFORGE_TEST_DEVICE=cpu python3 -m pytest -q tests/python/test_cuda.py
