# The forge device (bindings/forge): a PyTorch backend on PrivateUse1 whose kernels are opforge's
# CPU kernels run on forge's own memory and streams. It needs torch's full C++ API (allocator,
# device guard, hooks, aten kernels), so it is built per torch version (cmake/torch_versioned.cmake):
# the version also goes into the library (forge_torch_version()), and opforge.forge refuses,
# with an ImportError, a torch other than the one it was built for. OPFORGE_FORGE=OFF skips it.
option(OPFORGE_FORGE "Build the forge PyTorch device (PrivateUse1)" ON)
include(cmake/torch_versioned.cmake)

if(TARGET opforge_torch AND OPFORGE_FORGE)
  find_package(Threads REQUIRED)
  # No torch_python: Python reaches the library through torch.ops.load_library and ctypes.
  opforge_add_versioned_torch_library(opforge_forge ${PROJECT_SOURCE_DIR}/bindings/forge
    TORCH_LIBS torch torch_cpu c10
    LINK Threads::Threads)
  target_compile_definitions(opforge_forge PRIVATE OPFORGE_FORGE_TORCH_VERSION="${OPFORGE_TORCH_VERSION}")
  message(STATUS "opforge: forge device for torch ${OPFORGE_TORCH_VERSION}")
endif()
