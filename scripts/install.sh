#!/usr/bin/env bash
# Installs everything opforge needs on a fresh Debian machine (system packages, Python
# packages) and builds and installs opforge itself. With --tests, the build also compiles
# the C++ tests into build/ci for scripts/test.sh, and cross-compiles them for Arm (build/arm64).
set -euo pipefail
cd "$(dirname "$0")/.."

with_tests=0
[[ "${1:-}" == "--tests" ]] && with_tests=1

sudo=""
[[ "$(id -u)" -ne 0 ]] && sudo="sudo"
if command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  # Highway for runtime-dispatched SIMD, the DLPack header, GoogleTest, a compiler.
  $sudo apt-get install -y -qq g++ libhwy-dev libdlpack-dev libgtest-dev >/dev/null
fi

# torch is pinned: an unpinned torch pulls gigabytes of CUDA wheels. CMake from PyPI because
# Debian's 3.25 cannot pass C++20 to nvcc.
python3 -m pip install -q --disable-pip-version-check \
  "torch==2.13.0" "jax==0.10.2" "jaxlib==0.10.2" "numpy>=1.24" "pytest>=8" "pytest-xdist>=3" \
  "nanobind>=2.2" "scikit-build-core>=0.10" "cmake>=3.28" ninja matplotlib flatbuffers

# ggml's own CPU library: the reference of the ggml-format ops' tests (tests/python/test_ggml.py)
# and the competitor in bench/bench_matmul_q.py, through opforge.ggml_cpu. The pywhispercpp wheel
# ships it; only its libraries are used, hence no dependencies. Where no wheel fits (another
# Python or CPU), those tests skip.
python3 -m pip install -q --disable-pip-version-check --no-deps --only-binary=:all: "pywhispercpp==1.5.1" ||
  echo "no pywhispercpp wheel here: the comparisons with ggml will skip" >&2

# With a CUDA toolkit that lacks cuBLAS (as the development machines' does): NVIDIA's cuBLAS
# wheel for cublasLt.h, which linear_act's CUDA forward compiles against (the library is loaded
# at run time; torch's and JAX's CUDA builds bring their own copy).
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [[ -x "$nvcc" ]]; then
  cuda_major=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
  if [[ -n "$cuda_major" && ! -f /usr/local/cuda/include/cublasLt.h &&
        ! -f "$(dirname "$(dirname "$(readlink -f "$nvcc")")")/include/cublasLt.h" ]]; then
    wheel="nvidia-cublas==${cuda_major}.*"
    [[ "$cuda_major" -lt 13 ]] && wheel="nvidia-cublas-cu${cuda_major}"
    python3 -m pip install -q --disable-pip-version-check "$wheel"
  fi
fi

# No build isolation: the build must see the pinned packages above, not fetch its own.
args=(--no-build-isolation --disable-pip-version-check -q)
if [[ $with_tests -eq 1 ]]; then
  args+=(-Cbuild-dir=build/ci -Ccmake.define.OPFORGE_BUILD_TESTS=ON)
fi
python3 -m pip install "${args[@]}" .
if [[ $with_tests -eq 1 ]]; then bash scripts/build_arm64.sh; fi
echo "opforge installed: $(python3 -c 'import opforge; print(opforge.__version__, opforge.simd_target())')"
