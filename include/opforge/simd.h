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
