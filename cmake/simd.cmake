# Highway (Debian's libhwy-dev) for runtime-dispatched SIMD. Every kernel file is compiled for
# the same target set, so src/simd.cc can report it: on x86 AVX-512 (AVX3), AVX2, SSE4 and a
# portable fallback (EMU128); SSSE3 is skipped (no machine we target stops there).
find_package(hwy REQUIRED)

function(opforge_use_simd target)
  target_link_libraries(${target} PUBLIC hwy::hwy)
  target_compile_definitions(${target} PUBLIC "HWY_DISABLED_TARGETS=HWY_SSSE3")
endfunction()
