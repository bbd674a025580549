# The JAX adapter's FFI handlers, compiled into the Python module when jaxlib (and so its
# XLA FFI headers) is installed. XLA accepts handlers built against FFI headers at or below
# its own API version, so the jaxlib version built against is recorded for an import check.
function(opforge_add_jax_ffi target)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "import jax.ffi, jaxlib; print(jax.ffi.include_dir()); print(jaxlib.__version__)"
    OUTPUT_VARIABLE jax_info OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE jax_missing ERROR_QUIET)
  if(jax_missing)
    message(STATUS "opforge: jaxlib not found; building without the JAX adapter")
    return()
  endif()
  string(REPLACE "\n" ";" jax_info "${jax_info}")
  list(GET jax_info 0 jax_include)
  list(GET jax_info 1 jaxlib_version)
  message(STATUS "opforge: JAX FFI handlers against jaxlib ${jaxlib_version} (${jax_include})")
  target_sources(${target} PRIVATE bindings/jax/ffi_call.cc bindings/jax/ffi_cpu.cc bindings/jax/module.cc)
  if(OPFORGE_WITH_CUDA)
    target_sources(${target} PRIVATE bindings/jax/ffi_cuda.cc)
    target_include_directories(${target} PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  endif()
  target_include_directories(${target} PRIVATE "${jax_include}")
  target_compile_definitions(${target} PRIVATE OPFORGE_WITH_JAX=1 OPFORGE_JAXLIB_VERSION="${jaxlib_version}")
endfunction()
