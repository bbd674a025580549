# Libraries built against torch's full C++ API rather than its stable ABI
# (libopforge_torch_native.so, libopforge_forge.so): each loads only on the torch it was built
# against, so its version is written to lib<target>.version beside it and the Python side
# checks it before loading. Included by torch_native.cmake and forge.cmake.
include_guard(GLOBAL)

# opforge_add_versioned_torch_library(<target> <sources dir>
#     TORCH_LIBS <torch, torch_cpu, ...>  LINK <other targets and libraries>)
# Builds a shared library from <sources dir>/*.cc linked to opforge_core, installs it and its
# version file into the package, and sets OPFORGE_TORCH_VERSION in the caller's scope.
function(opforge_add_versioned_torch_library target sources_dir)
  cmake_parse_arguments(ARG "" "" "TORCH_LIBS;LINK" ${ARGN})
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
    OUTPUT_VARIABLE info OUTPUT_STRIP_TRAILING_WHITESPACE)
  string(REPLACE "\n" ";" info "${info}")
  list(GET info 0 torch_dir)
  list(GET info 1 torch_version)
  list(GET info 2 cxx11_abi)
  set(torch_libs "")
  foreach(lib IN LISTS ARG_TORCH_LIBS)
    find_library(OPFORGE_TORCH_LIB_${lib} ${lib} PATHS "${torch_dir}/lib" NO_DEFAULT_PATH REQUIRED)
    list(APPEND torch_libs ${OPFORGE_TORCH_LIB_${lib}})
  endforeach()

  file(GLOB sources CONFIGURE_DEPENDS ${sources_dir}/*.cc)
  add_library(${target} SHARED ${sources})
  target_include_directories(${target} SYSTEM PRIVATE
    "${torch_dir}/include" "${torch_dir}/include/torch/csrc/api/include")
  target_compile_definitions(${target} PRIVATE _GLIBCXX_USE_CXX11_ABI=${cxx11_abi})
  target_link_libraries(${target} PRIVATE opforge_core ${ARG_LINK} ${torch_libs})
  set_target_properties(${target} PROPERTIES
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
    INSTALL_RPATH "$ORIGIN;$ORIGIN/../torch/lib")
  set(version_file "${CMAKE_CURRENT_BINARY_DIR}/lib${target}.version")
  file(WRITE "${version_file}" "${torch_version}\n")
  install(TARGETS ${target} LIBRARY DESTINATION opforge)
  install(FILES "${version_file}" DESTINATION opforge)
  set(OPFORGE_TORCH_VERSION "${torch_version}" PARENT_SCOPE)
endfunction()
