# CUDA: compiled into the package when nvcc is found (OPFORGE_CUDA=AUTO), required with ON,
# skipped with OFF. Sets OPFORGE_WITH_CUDA. Architectures default to sm_80 and sm_90.
set(OPFORGE_WITH_CUDA OFF)

# cuBLASLt's header (src/backends/cublaslt.cu; the library itself is loaded at run time, never
# linked): the toolkit's, else the NVIDIA wheel's (nvidia-cublas, which scripts/install.sh
# installs when the toolkit lacks it, and which torch's and JAX's CUDA builds bring). Sets
# OPFORGE_CUBLASLT_INCLUDE_DIR, or leaves it NOTFOUND: linear_act then runs its own kernels only.
function(opforge_find_cublaslt_header)
  set(hints ${CUDAToolkit_INCLUDE_DIRS})
  set(python "${Python_EXECUTABLE}")
  if(NOT python)
    set(python python3)
  endif()
  set(wheel nvidia.cublas)  # CUDA 12's wheel layout; 13 moved every library under nvidia/cu13
  if(CUDAToolkit_VERSION_MAJOR GREATER_EQUAL 13)
    set(wheel nvidia.cu${CUDAToolkit_VERSION_MAJOR})
  endif()
  execute_process(
    COMMAND "${python}" -c "import importlib.util as u, os; s = u.find_spec('${wheel}'); print(';'.join(os.path.join(p, 'include') for p in (s.submodule_search_locations or []) if s))"
    OUTPUT_VARIABLE wheel_include OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  list(APPEND hints ${wheel_include})
  find_path(OPFORGE_CUBLASLT_INCLUDE_DIR cublasLt.h HINTS ${hints} NO_DEFAULT_PATH)
  if(OPFORGE_CUBLASLT_INCLUDE_DIR)
    message(STATUS "opforge: cuBLASLt for linear_act (header in ${OPFORGE_CUBLASLT_INCLUDE_DIR}, loaded at run time)")
  else()
    message(STATUS "opforge: no cublasLt.h (CUDA toolkit or the nvidia-cublas wheel); linear_act runs its own kernels only")
  endif()
endfunction()
if(NOT OPFORGE_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc's C++20 flag; pass it directly.
    add_compile_options($<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
    find_package(CUDAToolkit REQUIRED)
    set(OPFORGE_WITH_CUDA ON)
    message(STATUS "opforge: CUDA kernels enabled (${CMAKE_CUDA_COMPILER}, sm ${CMAKE_CUDA_ARCHITECTURES})")
    opforge_find_cublaslt_header()
  elseif(OPFORGE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "OPFORGE_CUDA=ON but no CUDA compiler was found")
  else()
    message(STATUS "opforge: no CUDA compiler found; building CPU-only")
  endif()
endif()
