#!/usr/bin/env bash
# Runs every test: the C++ core tests (built by `scripts/install.sh --tests`), pytest, and the GPU
# tests' CPU dry run.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -x build/ci/opforge_cpp_tests ]]; then
  echo "build/ci/opforge_cpp_tests is missing: run 'bash scripts/install.sh --tests' first" >&2
  exit 2
fi
ctest --test-dir build/ci --output-on-failure -j2
python3 -m pytest
# The GPU tests' own plumbing (samples, comparisons) on the CPU backend: a mistake there would
# otherwise surface only in the rare session with a GPU.
OPFORGE_TEST_DEVICE=cpu python3 -m pytest -q tests/python/test_cuda.py
