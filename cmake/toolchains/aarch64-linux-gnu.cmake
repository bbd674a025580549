# Cross-compiles opforge's C++ core, kernels and C++ tests for 64-bit Arm Linux (Highway's NEON
# target), run under QEMU's user-mode emulator (scripts/build_arm64.sh). Debian's cross compiler
# and its multiarch arm64 packages (libhwy-dev:arm64, libgtest-dev:arm64) are the toolchain.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr/lib/aarch64-linux-gnu)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# ctest and gtest_discover_tests run the test binary through the emulator. The libraries come
# from the multiarch root (/lib/aarch64-linux-gnu), the loader with them: the cross compiler's
# own glibc copy in /usr/aarch64-linux-gnu is another Debian revision, and that loader with the
# multiarch libc hung every test that restarts the thread pool (one thread looping in libc).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /)
