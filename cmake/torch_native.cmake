# libopforge_torch_native.so (bindings/torch_native): what the stable ABI cannot do: the
# Autograd kernels of every op in C++, and the direct call behind opforge.torch.<op>. Built
# against the full C++ API of the torch found at build time, so it only loads on that torch; its version goes to
# libopforge_torch_native.version next to it, and opforge.torch loads it only on a match
# (otherwise it registers the same autograd rules in Python). OPFORGE_TORCH_NATIVE=OFF skips it.
option(OPFORGE_TORCH_NATIVE "Build the torch-version-specific part of the torch adapter" ON)

function(opforge_add_torch_native)
  if(NOT TARGET opforge_torch OR NOT OPFORGE_TORCH_NATIVE)
    return()
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
    OUTPUT_VARIABLE info OUTPUT_STRIP_TRAILING_WHITESPACE)
  string(REPLACE "\n" ";" info "${info}")
  list(GET info 0 torch_dir)
  list(GET info 1 torch_version)
  list(GET info 2 cxx11_abi)
  foreach(lib torch torch_cpu torch_python c10)
    find_library(OPFORGE_LIB_${lib} ${lib} PATHS "${torch_dir}/lib" NO_DEFAULT_PATH REQUIRED)
  endforeach()
  message(STATUS "opforge: torch-specific adapter part (autograd in C++) for torch ${torch_version}")

  file(GLOB sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/bindings/torch_native/*.cc)
  add_library(opforge_torch_native SHARED ${sources})
  target_include_directories(opforge_torch_native SYSTEM PRIVATE
    "${torch_dir}/include" "${torch_dir}/include/torch/csrc/api/include")
  target_compile_definitions(opforge_torch_native PRIVATE _GLIBCXX_USE_CXX11_ABI=${cxx11_abi})
  # torch_python for THPVariable (the direct call); the Python symbols come from the interpreter.
  target_link_libraries(opforge_torch_native PRIVATE opforge_core opforge_torch Python::Module
    ${OPFORGE_LIB_torch} ${OPFORGE_LIB_torch_cpu} ${OPFORGE_LIB_torch_python} ${OPFORGE_LIB_c10})
  set_target_properties(opforge_torch_native PROPERTIES
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
    INSTALL_RPATH "$ORIGIN;$ORIGIN/../torch/lib")
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/libopforge_torch_native.version" "${torch_version}\n")
  install(TARGETS opforge_torch_native LIBRARY DESTINATION opforge)
  install(FILES "${CMAKE_CURRENT_BINARY_DIR}/libopforge_torch_native.version" DESTINATION opforge)
endfunction()

opforge_add_torch_native()
