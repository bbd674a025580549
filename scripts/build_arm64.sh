#!/usr/bin/env bash
# Cross-compiles opforge for 64-bit Arm Linux (Highway's NEON target), to run under QEMU's
# user-mode emulator (scripts/test.sh runs them), into build/arm64:
# - the C++ core, every op's CPU kernels and the C++ tests (ctest);
# - the Python module, staged as a package (stage/), an aarch64 Python to run it (python3:
#   Debian's libpython3.11 behind a two-line main) and NumPy's and pytest's aarch64 wheels
#   (site/), for the tour and the op tests' NumPy cases. Not torch: PyPI's aarch64 torch is a
#   CUDA build that needs NVIDIA's libraries to import.
# This machine has no Arm CPU: the emulator checks what the kernels compute, not how fast.
# Installs Debian's cross compiler, QEMU and the arm64 builds of Highway, GoogleTest and
# libpython3.11 (multiarch) where apt-get is available.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
[[ "$(id -u)" -ne 0 ]] && sudo="sudo"
if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v qemu-aarch64 >/dev/null ||
   ! dpkg -s libhwy-dev:arm64 libgtest-dev:arm64 libpython3.11-dev:arm64 >/dev/null 2>&1; then
  if ! command -v apt-get >/dev/null; then  # a skip, not a failure: scripts/test.sh says so
    echo "build_arm64.sh: no apt-get for g++-aarch64-linux-gnu, qemu-user, libhwy-dev:arm64; no Arm build" >&2
    exit 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo dpkg --add-architecture arm64
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends g++-aarch64-linux-gnu qemu-user \
    libhwy-dev:arm64 libgtest-dev:arm64 libpython3.11-dev:arm64 >/dev/null
fi

# The Python module too where this Python is 3.11, the minor version of Debian's arm64 libpython
# whose headers it compiles against (nanobind and jaxlib's headers come from this Python).
with_python=OFF
if python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  with_python=ON
else
  echo "build_arm64.sh: Python $(python3 -V) is not 3.11 (Debian's arm64 libpython): C++ tests only" >&2
fi
numpy_include=()
if [[ $with_python == ON ]]; then
  # NumPy and pytest for the emulated Python, first: the module compiles against that NumPy's
  # headers (its C API, for the NumPy fast path).
  python3 -m pip install -q --disable-pip-version-check --upgrade --target build/arm64/site \
    --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 --python-version 3.11 \
    --implementation cp --abi cp311 --only-binary=:all: --no-warn-conflicts "numpy>=1.24" "pytest>=8"
  for dir in build/arm64/site/numpy/_core/include build/arm64/site/numpy/core/include; do
    [[ -d $dir ]] && numpy_include=(-DOPFORGE_NUMPY_INCLUDE_DIR="$PWD/$dir") && break
  done
fi
cmake -S . -B build/arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
  -DCMAKE_BUILD_TYPE=Release -DOPFORGE_CUDA=OFF -DOPFORGE_BUILD_TESTS=ON -DOPFORGE_PYTHON=$with_python \
  -DOPFORGE_TORCH=OFF -DPython_EXECUTABLE="$(command -v python3)" -DPython_INCLUDE_DIR=/usr/include/python3.11 \
  -DPython_SOABI=cpython-311-aarch64-linux-gnu -DNB_SUFFIX=.cpython-311-aarch64-linux-gnu.so \
  -DNB_SUFFIX_S=.abi3.so "${numpy_include[@]}" >/dev/null
cmake --build build/arm64
[[ $with_python == ON ]] || exit 0

rm -rf build/arm64/stage
mkdir -p build/arm64/stage
cp -r python/opforge build/arm64/stage/
cmake --install build/arm64 --prefix build/arm64/stage >/dev/null

printf '#include <Python.h>\nint main(int argc, char** argv) { return Py_BytesMain(argc, argv); }\n' \
  > build/arm64/python_main.c
aarch64-linux-gnu-g++ -x c build/arm64/python_main.c -o build/arm64/python3 \
  -I/usr/include/python3.11 -I/usr/include/aarch64-linux-gnu/python3.11 -L/usr/lib/aarch64-linux-gnu \
  -lpython3.11 -Wl,-rpath-link=/usr/lib/aarch64-linux-gnu:/lib/aarch64-linux-gnu
