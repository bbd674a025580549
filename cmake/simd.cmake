# Highway (Debian's libhwy-dev) for runtime-dispatched SIMD. Every kernel file is compiled for
# the same target set, so src/simd.cc can report it: on x86 AVX-512 (AVX3), AVX2, SSE4 and a
# portable fallback (EMU128); SSSE3 is skipped (no machine we target stops there).
find_package(hwy REQUIRED)

function(opforge_use_simd target)
  target_link_libraries(${target} PUBLIC hwy::hwy)
  # No implicit FMA: GCC (gnu++20) fuses a*b+c wherever the target has FMA, and decides it per
  # instantiation, so one kernel compiled for two output masks rounded the same element two ways
  # (rms_norm_backward's grad_weight, on AVX2). A fused operation is written as one: hn::MulAdd,
  # or ScalarMulAdd (simd-inl.h) for the single elements that mirror it.
  target_compile_options(${target} PUBLIC $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off>)
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$")
    # SVE vectors are sizeless: they cannot be array elements or struct members, which the
    # kernels' register tiles are. Every SVE machine also runs NEON.
    target_compile_definitions(${target} PUBLIC
                               "HWY_DISABLED_TARGETS=(HWY_SVE|HWY_SVE2|HWY_SVE_256|HWY_SVE2_128)")
  else()
    target_compile_definitions(${target} PUBLIC "HWY_DISABLED_TARGETS=HWY_SSSE3")
  endif()
endfunction()
