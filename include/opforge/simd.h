// Which SIMD targets the CPU kernels were compiled for, which one runs, and a way to pin
// one (tests run every kernel on every target; OPFORGE_SIMD pins one for a process).
#pragma once

#include <string>
#include <vector>

namespace opforge {

std::vector<std::string> simd_targets_compiled();
// Compiled targets this CPU can run, best first.
std::vector<std::string> simd_targets_supported();
std::string simd_target_chosen();
// Restricts dispatch to one supported target; "" restores automatic choice.
// Error(value) names the supported targets when `name` is not one of them.
void set_simd_target(const std::string& name);

}  // namespace opforge

namespace opforge {

// Intel AMX (the tile matrix units of Sapphire Rapids and later Xeons). Supported: the CPU has
// AMX-TILE and AMX-BF16, the OS saves the tile state, and Linux granted it to this process
// (asked on the first call, as oneDNN does). Kernels use it under the AVX3 target while it is
// enabled: by default, unless OPFORGE_AMX=0; set_amx_enabled(false) turns it off for the
// process (the AVX-512 kernels then run, as on CPUs without AMX).
bool amx_supported();
bool amx_enabled();  // supported and not turned off
void set_amx_enabled(bool enabled);

}  // namespace opforge

namespace opforge {

// AVX512_BF16's float -> bfloat16 conversion (vcvtneps2bf16: Zen 4 and later, Cooper Lake,
// Sapphire Rapids and later). The AVX-512 kernels store bfloat16 results with it where the CPU
// has it: one instruction where rounding in software takes about nine. Same bits either way:
// both round to nearest even and quiet NaNs, and a vector holding a subnormal lane (which the
// instruction flushes to zero) is rounded in software. On by default, unless
// OPFORGE_BF16_CONVERT=0; set_bf16_convert_enabled(false) turns it off (tests compare the two).
bool bf16_convert_supported();
bool bf16_convert_enabled();  // supported and not turned off
void set_bf16_convert_enabled(bool enabled);

// AVX512_BF16's dot products (vdpbf16ps): linear_act's bfloat16 products on the AVX-512 target
// multiply pairs of bfloat16 values in one instruction, twice the float32 FMA's products. Like
// AMX (and oneDNN's kernels on these CPUs), not the bits of the float32 product: each pair adds
// its odd product, then its even one, and denormal inputs and results are flushed to zero. Used
// where the CPU has the instruction and both operands are bfloat16, K even, each with contiguous
// 4-byte aligned rows or transposed (rows side by side, copied into pairs once); on by default, unless OPFORGE_BF16_DOT=0; set_bf16_dot_enabled(false) turns it
// off (the float32 FMA product then runs).
bool bf16_dot_supported();
bool bf16_dot_enabled();  // supported and not turned off
void set_bf16_dot_enabled(bool enabled);

// Whether linear_act_backward's CPU kernel rounds g = grad * act'(z) to bfloat16 for bfloat16
// inputs before its two products, as torch's and JAX's bfloat16 backward do (their activation
// gradient is a bfloat16 tensor). Off by default: g stays float32, so the products take the
// float32 FMA product (AMX: g split into two bfloat16 parts), one rounding per result. On
// (OPFORGE_BF16_GRAD_ROUNDING=1, set_bf16_grad_rounding_enabled(true)), they run as bfloat16
// products (AVX512_BF16 pairs, AMX tiles), about twice as fast, at one more rounding per term.
// grad_bias sums the float32 g either way; act="none" needs no rounding (g is grad).
bool bf16_grad_rounding_enabled();
void set_bf16_grad_rounding_enabled(bool enabled);

namespace detail {
// bf16_convert_enabled(), read by every bfloat16 store of the AVX-512 kernels (a plain load they
// may keep in a register for a loop; the switch is for between calls, not during one).
extern bool bf16_convert_on;
}  // namespace detail

}  // namespace opforge
