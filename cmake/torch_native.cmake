# libopforge_torch_native.so (bindings/torch_native): what the stable ABI cannot do: the
# Autograd kernels of every op in C++, and the direct call behind opforge.torch.<op>. Built
# against the full C++ API of the torch found at build time, so it only loads on that torch
# (cmake/torch_versioned.cmake); opforge.torch loads it only on a match (otherwise it registers
# the same autograd rules in Python). OPFORGE_TORCH_NATIVE=OFF skips it.
option(OPFORGE_TORCH_NATIVE "Build the torch-version-specific part of the torch adapter" ON)
include(cmake/torch_versioned.cmake)

if(TARGET opforge_torch AND OPFORGE_TORCH_NATIVE)
  # torch_python for THPVariable (the direct call); the Python symbols come from the interpreter.
  opforge_add_versioned_torch_library(opforge_torch_native ${PROJECT_SOURCE_DIR}/bindings/torch_native
    TORCH_LIBS torch torch_cpu torch_python c10
    LINK opforge_torch Python::Module)
  message(STATUS "opforge: torch-specific adapter part (autograd in C++) for torch ${OPFORGE_TORCH_VERSION}")
endif()
