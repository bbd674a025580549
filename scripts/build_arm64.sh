#!/usr/bin/env bash
# Cross-compiles the C++ core, every op's CPU kernels and the C++ tests for 64-bit Arm Linux
# (Highway's NEON target) into build/arm64, to run under QEMU's user-mode emulator:
# `ctest --test-dir build/arm64` (scripts/test.sh does). This machine has no Arm CPU; the
# emulator checks what the kernels compute, not how fast. Installs Debian's cross compiler,
# QEMU and the arm64 builds of Highway and GoogleTest (multiarch) where apt-get is available.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
[[ "$(id -u)" -ne 0 ]] && sudo="sudo"
if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v qemu-aarch64 >/dev/null ||
   ! dpkg -s libhwy-dev:arm64 libgtest-dev:arm64 >/dev/null 2>&1; then
  if ! command -v apt-get >/dev/null; then  # a skip, not a failure: scripts/test.sh says so
    echo "build_arm64.sh: no apt-get for g++-aarch64-linux-gnu, qemu-user, libhwy-dev:arm64; no Arm build" >&2
    exit 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo dpkg --add-architecture arm64
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends g++-aarch64-linux-gnu qemu-user \
    libhwy-dev:arm64 libgtest-dev:arm64 >/dev/null
fi

cmake -S . -B build/arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
  -DCMAKE_BUILD_TYPE=Release -DOPFORGE_PYTHON=OFF -DOPFORGE_CUDA=OFF -DOPFORGE_BUILD_TESTS=ON >/dev/null
cmake --build build/arm64 --target opforge_cpp_tests
