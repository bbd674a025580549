# opforge_cuda_emulated_tests: every op's CUDA kernels compiled for the CPU and run by the host
# emulator (tests/cuda_emulator), against the CPU kernels. Needs the CUDA headers, not a GPU; the
# kernels' sources are rewritten (rewrite_launches.py: <<<>>> launches) into the build tree first.
# cuBLASLt: with its header, opforge's real loader (src/backends/cublaslt.cu) loads a host
# libcublasLt written from NVIDIA's documented contract (tests/cuda_emulator/cublaslt_mock.cc);
# without it, a host stand-in for opforge/cuda/blaslt.h (blaslt_standin.cu).
find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(emulator_dir ${CMAKE_CURRENT_SOURCE_DIR}/tests/cuda_emulator)
set(mirror ${CMAKE_CURRENT_BINARY_DIR}/cuda_emulated)
file(GLOB emulated_inputs CONFIGURE_DEPENDS RELATIVE ${CMAKE_CURRENT_SOURCE_DIR}
     include/opforge/cuda/*.cuh ops/*/*.cu ops/*/*.cuh tests/cuda_emulator/*.cu)
list(APPEND emulated_inputs src/backends/cuda_backend.cu)  # the emulated devices' backend
list(APPEND emulated_inputs bench/schedules_cuda.cu)  # a GPU program; its test runs it here
if(OPFORGE_CUBLASLT_INCLUDE_DIR)
  list(REMOVE_ITEM emulated_inputs tests/cuda_emulator/blaslt_standin.cu)
  list(APPEND emulated_inputs src/backends/cublaslt.cu)
endif()
set(emulated_sources)
set(emulated_headers)
foreach(rel ${emulated_inputs})
  if(rel MATCHES "\\.cu$")
    set(out ${mirror}/${rel}.cc)
    list(APPEND emulated_sources ${out})
  else()
    set(out ${mirror}/${rel})
    list(APPEND emulated_headers ${out})
  endif()
  add_custom_command(OUTPUT ${out}
                     COMMAND Python3::Interpreter ${emulator_dir}/rewrite_launches.py ${rel} ${out}
                     DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${rel} ${emulator_dir}/rewrite_launches.py
                     WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR} VERBATIM)
endforeach()
# The rewritten headers exist before any rewritten source compiles.
add_custom_target(opforge_cuda_emulated_headers DEPENDS ${emulated_headers})

add_executable(opforge_cuda_emulated_tests ${emulated_sources} ${emulator_dir}/emulator.cc ${emulator_dir}/device.cc
               ${emulator_dir}/op_cases.cc ${emulator_dir}/test_cuda_emulated.cc
               ${emulator_dir}/test_in_place_emulated.cc)
add_dependencies(opforge_cuda_emulated_tests opforge_cuda_emulated_headers)
# The rewritten headers first, then the emulator's stand-ins (cub), then the real tree and the
# toolkit's headers (cuda_runtime.h, cuda_fp16.h compile as host C++).
target_include_directories(opforge_cuda_emulated_tests BEFORE PRIVATE ${mirror}/include ${mirror} ${emulator_dir})
target_include_directories(opforge_cuda_emulated_tests PRIVATE ${CUDAToolkit_INCLUDE_DIRS} src)
target_link_libraries(opforge_cuda_emulated_tests PRIVATE opforge_core GTest::gtest_main)
# Hidden: the emulated kernels, and the CUDA runtime calls the emulator defines, must not interpose
# libopforge's own (real) CUDA code, which the test links beside them. -O1 keeps the compile short.
# UBSan's alignment check: a GPU faults on any access not aligned to its size (a 16-byte vector
# load from an address 4 bytes in: "misaligned address"), which x86 forgives; here it stops the
# test naming the source line. -ffp-contract=fast undoes opforge's contract=off (cmake/simd.cmake)
# for the kernels: nvcc fuses a*b+c by default (--fmad=true), so they round as on a GPU.
set_source_files_properties(${emulated_sources} PROPERTIES COMPILE_OPTIONS
                            "-include;${emulator_dir}/cuda_emulator.h;-O1;-Wno-unknown-pragmas;-fsanitize=alignment;-fno-sanitize-recover=alignment;-ffp-contract=fast")
target_link_options(opforge_cuda_emulated_tests PRIVATE -fsanitize=alignment)
target_compile_options(opforge_cuda_emulated_tests PRIVATE -fvisibility=hidden -fvisibility-inlines-hidden)
if(OPFORGE_CUBLASLT_INCLUDE_DIR)
  add_library(opforge_cublaslt_mock SHARED ${emulator_dir}/cublaslt_mock.cc)
  target_include_directories(opforge_cublaslt_mock PRIVATE ${OPFORGE_CUBLASLT_INCLUDE_DIR} ${CUDAToolkit_INCLUDE_DIRS})
  set_source_files_properties(${mirror}/src/backends/cublaslt.cu.cc PROPERTIES COMPILE_DEFINITIONS OPFORGE_WITH_CUBLASLT=1)
  target_include_directories(opforge_cuda_emulated_tests PRIVATE ${OPFORGE_CUBLASLT_INCLUDE_DIR})
  target_compile_definitions(opforge_cuda_emulated_tests PRIVATE
                             CUDA_EMU_CUBLASLT_MOCK="$<TARGET_FILE:opforge_cublaslt_mock>")
  target_link_libraries(opforge_cuda_emulated_tests PRIVATE ${CMAKE_DL_LIBS})
  add_dependencies(opforge_cuda_emulated_tests opforge_cublaslt_mock)
endif()
set_source_files_properties(${mirror}/src/backends/cuda_backend.cu.cc PROPERTIES COMPILE_DEFINITIONS
                            OPFORGE_CUDA_BACKEND_NAME="cuda_emulated")
gtest_discover_tests(opforge_cuda_emulated_tests TEST_PREFIX "cuda_emulated." PROPERTIES TIMEOUT 600)
