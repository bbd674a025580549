#!/usr/bin/env bash
# The GPU verification, run on a GPU machine (the H100/H200 test machine: no network, one
# 10-minute command): builds opforge with its CUDA kernels, runs the GPU tests, the GPU
# benchmark, compute-sanitizer (memcheck, racecheck) over a focused GPU subset, the kernels under
# other schedules (bench/schedules_cuda.cu), a profile of the slowest ops and their hardware
# counters, the forge device's tests in a process of their own, the whole test suite with the GPU
# present (in parallel with pytest-xdist where it is installed) and the torch adapter built
# elsewhere (stable ABI), in that order (what the issue asks for first: a session has 15 minutes of
# device time, start-up included), each step with the time the earlier ones left. Every step is
# logged; a failing step does not stop the later ones; the exit status is 1 if any step failed.
# From the repository root:
#
#   bash scripts/gpu_check.sh                       # on the GPU machine
#   bash scripts/gpu_check.sh --bundle-deps DIR     # on a dev machine: Highway + DLPack headers
#                                                   # and pytest-xdist's wheels into DIR, for a
#                                                   # GPU machine without them
#
# The summary, the ops_cuda benchmark tables and one archive of the step logs
# (gpu_check_logs.tar.gz: the device runner brings back at most 8 files) go to $OUT when set,
# else bench/results/. The build uses build/gpu-deps (from --bundle-deps) when the system has no
# Highway. Time budget: GPU_CHECK_BUDGET_S (default 540 s) in all.
#
# GPU_CHECK_STEPS (comma-separated step names, or "all", the default) picks the steps. Measured on
# the H200 at 794c939 (2026-11-27), the test steps under pytest-xdist (-n 12, the bundle's wheels):
# build 91 s, test_cuda 49 s, the benchmark 81 s, memcheck 9 s, racecheck 13 s, schedules 42 s,
# profile 12 s, ncu 32 s (342 s for the first call below; the machine's start-up about 32 s more);
# forge 84 s, the suite past 139 s (95% of its 15093 tests by then: about 150 s in all), the
# stable-ABI check 91 s. A session's 900 s of device time (start-up included) holds both calls on
# one warm machine (it goes back after 30 s idle: send the second at once, without building again;
# a session that cut the second to keep time for a later run had no time left for one anyway):
#   GPU_CHECK_BUDGET_S=380 GPU_CHECK_STEPS=build,test_cuda,bench,memcheck,racecheck,schedules,profile,ncu bash scripts/gpu_check.sh
#   GPU_CHECK_BUDGET_S=<900 - 32 - the first's time - 30> GPU_CHECK_STEPS=forge,suite,stable_abi_foreign_binary bash scripts/gpu_check.sh
# The suite logs its 25 slowest tests (--durations), for the next budget.
set -uo pipefail
cd "$(dirname "$0")/.."

# The sources the carried adapter was built from: it calls into libopforge.so, so it must be
# the same code as the build here (a digest, not a commit: the working tree travels without .git).
sources_digest() {
  find include src bindings/common bindings/torch -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16
}

# Every compiled source and test: what names the commit a GPU run built (see --bundle-deps).
code_digest() {
  find include src bindings ops tests -type f -not -name '*.pyc' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16
}

if [[ "${1:-}" == "--bundle-deps" ]]; then
  dest="${2:?usage: gpu_check.sh --bundle-deps DIR}"
  arch_dir="lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
  mkdir -p "$dest/include" "$dest/$arch_dir/cmake"
  cp -r /usr/include/hwy "$dest/include/"
  cp -r /usr/include/dlpack "$dest/include/"
  cp -r "/usr/$arch_dir/cmake/hwy" "$dest/$arch_dir/cmake/"
  cp -a /usr/"$arch_dir"/libhwy*.so* "$dest/$arch_dir/"
  # The stable-ABI torch adapter as built here (this machine's torch headers), for the
  # cross-version check on the GPU machine's older torch.
  mkdir -p "$dest/stable-abi"
  python3 -c 'import opforge, os; print(os.path.join(os.path.dirname(opforge.__file__), "libopforge_torch.so"))' \
    | xargs -I{} cp {} "$dest/stable-abi/"
  python3 -c 'import torch; print(torch.__version__)' > "$dest/stable-abi/built-with-torch.txt"
  sources_digest > "$dest/stable-abi/sources.txt"
  # pytest-xdist and pytest-timeout for the GPU machine (no network there): its 16 cores run the
  # test steps in parallel; the whole suite took past 240 s serially on the H200.
  python3 -m pip download -q --only-binary=:all: --no-deps --dest "$dest/wheels" pytest-xdist execnet pytest-timeout ||
    echo "warning: pytest-xdist not downloaded: the GPU machine's test steps will run serially" >&2
  # The GPU machine's copy of the tree has no usable git history: name the commit here.
  echo "$(code_digest) $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- include src bindings ops tests ||
    echo ' + uncommitted changes')" > "$dest/commit.txt"
  du -sh "$dest"
  exit 0
fi

START=$SECONDS
TOTAL_BUDGET=${GPU_CHECK_BUDGET_S:-540}
RESULTS="${OUT:-bench/results}"
LOGS=$(mktemp -d /tmp/gpu_check_logs.XXXX)  # archived into $RESULTS at the end
mkdir -p "$RESULTS"
SUMMARY="$RESULTS/gpu_check_summary.txt"
: > "$SUMMARY"
failed=0

left() { echo $(( TOTAL_BUDGET - (SECONDS - START) )); }
note() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME CAP_SECONDS COMMAND...: runs with min(CAP, time left), SIGINT first (pytest then
# prints its summary), logs to $LOGS/gpu_check_NAME.log.
STEPS=${GPU_CHECK_STEPS:-all}
wanted() { [[ $STEPS == all || ",$STEPS," == *",$1,"* ]]; }

step() {
  local name=$1 cap=$2
  shift 2
  if ! wanted "$name"; then
    echo "=== $name: not in GPU_CHECK_STEPS ($STEPS)"
    return
  fi
  local budget
  budget=$(left)
  (( budget > cap )) && budget=$cap
  if (( budget < 15 )); then
    note "SKIP  $name (no time left)"
    return
  fi
  local t0=$SECONDS
  echo "=== $name (up to ${budget}s): $*"
  timeout -s INT -k 20 "$budget" "$@" > "$LOGS/gpu_check_$name.log" 2>&1
  local rc=$?
  tail -n 25 "$LOGS/gpu_check_$name.log"
  if (( rc == 0 )); then
    note "PASS  $name ($((SECONDS - t0))s)"
  else
    (( rc == 124 || rc == 130 )) && note "TIME  $name hit its ${budget}s limit (rc $rc)" || note "FAIL  $name (rc $rc, $((SECONDS - t0))s)"
    failed=1
  fi
}

# The sources, named by the commit --bundle-deps recorded where they are the same (git on the GPU
# machine saw an old HEAD: both H100 runs reported the first's commit).
code=$(code_digest)
read -r bundled_code bundled_commit < build/gpu-deps/commit.txt 2>/dev/null || bundled_code=""
if [[ -z $bundled_code ]]; then
  sources="unknown commit (no build/gpu-deps/commit.txt)"
elif [[ $bundled_code == "$code" ]]; then
  sources="commit $bundled_commit"
else
  sources="changed since the bundle's commit $bundled_commit: rerun --bundle-deps after committing"
fi
note "gpu_check on $(hostname) at $(date -u +%FT%TZ), sources $code: $sources"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$SUMMARY"
python3 -c 'import torch, jax; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "| jax", jax.__version__, jax.devices())' 2>&1 | tee -a "$SUMMARY"

# --- build --------------------------------------------------------------------------------------
# Into the machine's own Python (a throwaway machine): its python3 is a venv holding torch, jax,
# nanobind and scikit-build-core, and a venv made from it with --system-site-packages would see
# the base interpreter's packages instead (no scikit-build-core: the build failed that way).
PY=python3
# sm_90 only (the H100): half the CUDA compile time of the default sm_80 + sm_90.
cmake_args=(-Ccmake.define.CMAKE_CUDA_ARCHITECTURES=${GPU_CHECK_CUDA_ARCH:-90} -Ccmake.define.OPFORGE_CUDA=ON
            "-Cbuild-dir=${GPU_CHECK_BUILD_DIR:-build/gpu}")
arch_dir="lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
system_hwy=0
for f in /usr/"$arch_dir"/cmake/hwy/hwy-config.cmake /usr/lib/cmake/hwy/hwy-config.cmake /usr/local/lib/cmake/hwy/hwy-config.cmake; do
  [[ -e $f ]] && system_hwy=1
done
if (( ! system_hwy )) && [[ -d build/gpu-deps ]]; then
  deps="$PWD/build/gpu-deps"
  note "Highway: not on the system; using $deps"
  cmake_args+=("-Ccmake.define.hwy_DIR=$deps/$arch_dir/cmake/hwy")
  export CPATH="$deps/include${CPATH:+:$CPATH}"
  export LD_LIBRARY_PATH="$deps/$arch_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # For the linker too: the plugin tests (opforge build-plugin) link -lhwy.
  export LIBRARY_PATH="$deps/$arch_dir${LIBRARY_PATH:+:$LIBRARY_PATH}"
fi
export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
install=("$PY" -m pip install --no-build-isolation --no-deps --no-index --disable-pip-version-check -v "${cmake_args[@]}" .)
if [[ $PY == python3 ]] && python3 -m pip install --help 2>/dev/null | grep -q break-system-packages; then
  install+=(--break-system-packages)  # where python3 is the system's own
fi
step build 330 "${install[@]}"
# The backends, and whether linear_act's products run through cuBLASLt beside torch (which loads it).
if ! "$PY" -c 'import torch, opforge, sys; i = opforge.info(); print(i["backends"]); print("cuBLASLt:", i["cublaslt"]); sys.exit(0 if i["built_with_cuda"] else 1)' 2>&1 | tee -a "$SUMMARY"; then
  note "FAIL  opforge is not importable or was built without CUDA: see gpu_check_build.log"
  tar -czf "$RESULTS/gpu_check_logs.tar.gz" -C "$LOGS" .
  exit 1
fi

# pytest-xdist and pytest-timeout from the bundle's wheels where the machine lacks them (--no-deps:
# its own pytest stays).
if [[ -d build/gpu-deps/wheels ]] && ! "$PY" -c 'import xdist, pytest_timeout' 2> /dev/null; then
  wheels=("$PY" -m pip install --no-deps --no-index --disable-pip-version-check -q --find-links build/gpu-deps/wheels
          pytest-xdist execnet pytest-timeout)
  [[ " ${install[*]} " == *" --break-system-packages "* ]] && wheels+=(--break-system-packages)
  "${wheels[@]}" 2>&1 | tail -n 3 || true
fi

# JAX would take 75% of the GPU at its first use; torch and the sanitizer need room too.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
pytest=("$PY" -m pytest -p no:cacheprovider)
# In parallel where pytest-xdist is installed; -vv (pyproject's addopts has -q, which one -v
# only cancels) logs every result as it comes, so a step cut at its time limit still shows what
# failed and what it never reached; a hung test is stopped where pytest-timeout is installed.
pytest_parallel=("${pytest[@]}")
if "$PY" -c 'import xdist' 2> /dev/null; then
  pytest_parallel+=(-n "${GPU_CHECK_WORKERS:-12}" -vv)
fi
if "$PY" -c 'import pytest_timeout' 2> /dev/null; then
  pytest_parallel+=(--timeout 120)
fi

# --- the GPU tests first: every op with a CUDA kernel, every dtype, torch / jax / CuPy ------------
step test_cuda 150 "${pytest_parallel[@]}" -rfEs tests/python/test_cuda.py

# --- the benchmark (its tables are written as it goes; the issue's ops first) -----------------------
bench_budget=${GPU_CHECK_BENCH_S:-120}
step bench $((bench_budget + 60)) "$PY" bench/bench_gpu.py --mib 256 --repeats 30 --out "$RESULTS" --budget-s "$bench_budget"

# --- compute-sanitizer over small GPU cases (every kernel, float32; the tiling edges of matmul_q) --
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n 1)
subset="torch_tensors_match_cpu and float32 or matmul_q_bits_match_cpu and (m1- or m4- or m9- or m32- or m37- or m70- or m96- or m130-) or strided_inputs and float16"
# Without torch's caching allocator every tensor is its own allocation, so memcheck sees overruns
# that would otherwise land inside a cached block.
if ! wanted memcheck && ! wanted racecheck; then
  :
elif [[ -z "$SAN" ]]; then
  note "FAIL  compute-sanitizer not found (memcheck and racecheck not run)"
  failed=1
else
  step memcheck 90 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SAN" --tool memcheck --target-processes all --error-exitcode 9 \
    "${pytest[@]}" -x tests/python/test_cuda.py -k "$subset"
  # racecheck looks at shared memory: the kernels that use it (norms, softmax, reductions, matmul_q).
  step racecheck 70 "$SAN" --tool racecheck --target-processes all --error-exitcode 9 \
    "${pytest[@]}" -x tests/python/test_cuda.py \
    -k "torch_tensors_match_cpu and float32 and (matmul_q or norm or softmax or backward) or matmul_q_bits_match_cpu and (m1- or m4- or m32- or m37- or m70- or m96- or m130-) or scatter_add_staged_buckets and float32"
fi

# --- what decides the next kernel changes (diagnostics: last in the first call, so a short budget
# cuts these, not the checks above) ----------------------------------------------------------------
# The norms', the elementwise and scatter_add's summing kernels under other schedules (packs per
# thread, row types, layouts, accesses, loads ahead), and a token's matmul_q in one launch and in
# two, beside the ops' own, compiled from the same headers (bench/schedules_cuda.cu): its table into $RESULTS/schedules_cuda.md, its CSV
# into the logs' archive. Up to 120 s: nvcc takes 40 s for its ~130 kernels on the development
# machine, the run about 20 s (outputs compared on the device).
nvcc_bin=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
lab_includes=(-Iinclude -I.)
[[ -d build/gpu-deps/include ]] && lab_includes+=(-Ibuild/gpu-deps/include)
step schedules 120 bash -c 'set -o pipefail; mkdir -p build && "$0" -O3 -std=c++20 -arch=sm_$1 "${@:4}" bench/schedules_cuda.cu -o build/schedules_cuda &&
  build/schedules_cuda "$2" | tee "$3"' "$nvcc_bin" "${GPU_CHECK_CUDA_ARCH:-90}" "$LOGS/schedules_cuda.csv" \
  "$RESULTS/schedules_cuda.md" "${lab_includes[@]}"
# Where the slowest ops' time goes (kernels vs the host), into $RESULTS/profile_cuda.txt, and the
# hardware counters of their kernels and of torch.compile's norms (Nsight Compute, where it can
# read them), into $RESULTS/ncu_kernels.csv.
step profile 60 "$PY" bench/profile_gpu.py --out "$RESULTS"
step ncu 120 "$PY" bench/ncu_kernels.py --out "$RESULTS"

# --- the forge device: registering it makes torch take it for the accelerator, after which CUDA
# backward passes fail in that process (pytorch/pytorch#161129), so its tests skip themselves beside
# a GPU unless OPFORGE_TEST_FORGE=1, and run here in a pytest process of their own.
step forge 120 env OPFORGE_TEST_FORGE=1 "${pytest_parallel[@]}" -rfE tests/python/test_forge.py \
  tests/python/test_autocast.py tests/python/test_saved_tensors.py -k forge


# --- everything else, with the GPU present (test_torch's and test_jax's CUDA cases included) -----
step suite 300 "${pytest_parallel[@]}" -rfE --durations=25 tests/python ops --ignore=tests/python/test_cuda.py

# --- the stable-ABI promise: the torch adapter built on the development machine (newer torch
# headers, TORCH_TARGET_VERSION 2.11), carried in build/gpu-deps/stable-abi/, loaded by this
# machine's torch and run through the torch tests; then the native build is put back.
stable="$PWD/build/gpu-deps/stable-abi/libopforge_torch.so"
if ! wanted stable_abi_foreign_binary; then
  :
elif [[ -f $stable && "$(cat build/gpu-deps/stable-abi/sources.txt 2>/dev/null)" != "$(sources_digest)" ]]; then
  note "SKIP  stable_abi_foreign_binary (the carried adapter was built from other sources: rerun --bundle-deps)"
elif [[ -f $stable ]]; then
  site=$("$PY" -c 'import opforge, os; print(os.path.dirname(opforge.__file__))')
  note "stable ABI: adapter built with torch $(cat build/gpu-deps/stable-abi/built-with-torch.txt 2>/dev/null), running on $("$PY" -c 'import torch; print(torch.__version__)')"
  cp "$site/libopforge_torch.so" /tmp/libopforge_torch.native-build.so
  cp "$stable" "$site/libopforge_torch.so"
  step stable_abi_foreign_binary 120 "${pytest_parallel[@]}" -x tests/python/test_torch.py
  cp /tmp/libopforge_torch.native-build.so "$site/libopforge_torch.so"
else
  note "SKIP  stable_abi_foreign_binary (no $stable: run --bundle-deps on the development machine)"
fi

note "total $((SECONDS - START))s; logs in $RESULTS/gpu_check_logs.tar.gz"
tar -czf "$RESULTS/gpu_check_logs.tar.gz" -C "$LOGS" .
exit $failed
