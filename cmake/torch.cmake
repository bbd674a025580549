# The PyTorch adapter (bindings/torch): libopforge_torch.so, installed next to libopforge.so and
# loaded by opforge.torch with torch.ops.load_library. Built when `import torch` works at
# configure time (OPFORGE_TORCH=AUTO), required with ON, skipped with OFF.
#
# It uses LibTorch's stable ABI only (the C shim and the header-only torch/csrc/stable and
# torch/headeronly headers), targeting torch 2.11, so one binary loads on torch 2.11 and every
# later version without a rebuild. tests/python/test_torch.py checks the built library imports
# no C++ symbol from c10, at or torch.
set(OPFORGE_TORCH "AUTO" CACHE STRING "Build the PyTorch adapter: AUTO (when torch is importable), ON, OFF")
set(OPFORGE_TORCH_TARGET_VERSION "0x020b000000000000" CACHE STRING
    "Oldest torch the adapter loads on, as TORCH_TARGET_VERSION (0x020b... is 2.11)")

function(opforge_add_torch_adapter)
  if(OPFORGE_TORCH STREQUAL "OFF")
    return()
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__)"
    OUTPUT_VARIABLE torch_info OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE torch_missing ERROR_QUIET)
  if(torch_missing)
    if(OPFORGE_TORCH STREQUAL "ON")
      message(FATAL_ERROR "OPFORGE_TORCH=ON but `import torch` fails")
    endif()
    message(STATUS "opforge: torch not found; building without the torch adapter")
    return()
  endif()
  string(REPLACE "\n" ";" torch_info "${torch_info}")
  list(GET torch_info 0 torch_dir)
  list(GET torch_info 1 torch_version)
  # The headers must know the targeted version (2.11's shim functions and conversions).
  if(torch_version VERSION_LESS 2.11)
    message(STATUS "opforge: torch ${torch_version} is older than 2.11; building without the torch adapter")
    return()
  endif()
  # libtorch_cpu.so exports the shim (aoti_torch_*, torch_*); linking it records the dependency,
  # which the loader satisfies from the copy torch has already loaded.
  find_library(OPFORGE_LIBTORCH_CPU torch_cpu PATHS "${torch_dir}/lib" NO_DEFAULT_PATH REQUIRED)
  message(STATUS "opforge: torch adapter against torch ${torch_version} headers, stable ABI target ${OPFORGE_TORCH_TARGET_VERSION}")

  file(GLOB sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/bindings/torch/*.cc)
  add_library(opforge_torch SHARED ${sources})
  target_include_directories(opforge_torch SYSTEM PRIVATE "${torch_dir}/include")
  target_compile_definitions(opforge_torch PRIVATE TORCH_TARGET_VERSION=${OPFORGE_TORCH_TARGET_VERSION})
  target_link_libraries(opforge_torch PRIVATE opforge_core "${OPFORGE_LIBTORCH_CPU}" ${CMAKE_DL_LIBS})
  # Only the two extern "C" entry points are exported; torch finds the kernels by registration.
  set_target_properties(opforge_torch PROPERTIES
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
    INSTALL_RPATH "$ORIGIN;$ORIGIN/../torch/lib")
  install(TARGETS opforge_torch LIBRARY DESTINATION opforge)
endfunction()

opforge_add_torch_adapter()
