# The forge device (bindings/forge): a PyTorch backend on PrivateUse1 whose kernels are opforge's
# CPU kernels run on forge's own memory and streams. It needs torch's full C++ API (allocator,
# device guard, hooks, aten kernels), so it is built per torch version: the version goes into
# the library (forge_torch_version()) and into libopforge_forge.version beside it, and
# opforge.forge refuses, with an ImportError, a torch other than the one it was built for.
# OPFORGE_FORGE=OFF skips it.
option(OPFORGE_FORGE "Build the forge PyTorch device (PrivateUse1)" ON)

function(opforge_add_forge)
  if(NOT TARGET opforge_torch OR NOT OPFORGE_FORGE)
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
  foreach(lib torch torch_cpu c10)
    find_library(OPFORGE_FORGE_LIB_${lib} ${lib} PATHS "${torch_dir}/lib" NO_DEFAULT_PATH REQUIRED)
  endforeach()
  message(STATUS "opforge: forge device for torch ${torch_version}")

  file(GLOB sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/bindings/forge/*.cc)
  add_library(opforge_forge SHARED ${sources})
  target_include_directories(opforge_forge SYSTEM PRIVATE
    "${torch_dir}/include" "${torch_dir}/include/torch/csrc/api/include")
  target_compile_definitions(opforge_forge PRIVATE _GLIBCXX_USE_CXX11_ABI=${cxx11_abi}
    OPFORGE_FORGE_TORCH_VERSION="${torch_version}")
  # No torch_python: Python reaches the library through torch.ops.load_library and ctypes.
  target_link_libraries(opforge_forge PRIVATE opforge_core
    ${OPFORGE_FORGE_LIB_torch} ${OPFORGE_FORGE_LIB_torch_cpu} ${OPFORGE_FORGE_LIB_c10} Threads::Threads)
  set_target_properties(opforge_forge PROPERTIES
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
    INSTALL_RPATH "$ORIGIN;$ORIGIN/../torch/lib")
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/libopforge_forge.version" "${torch_version}\n")
  install(TARGETS opforge_forge LIBRARY DESTINATION opforge)
  install(FILES "${CMAKE_CURRENT_BINARY_DIR}/libopforge_forge.version" DESTINATION opforge)
endfunction()

find_package(Threads REQUIRED)
opforge_add_forge()
