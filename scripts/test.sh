#!/usr/bin/env bash
# Runs every test: the C++ core tests (built by `scripts/install.sh --tests`) and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -x build/ci/opforge_cpp_tests ]]; then
  echo "build/ci/opforge_cpp_tests is missing: run 'bash scripts/install.sh --tests' first" >&2
  exit 2
fi
ctest --test-dir build/ci --output-on-failure -j2
python3 -m pytest
