// The emulated CUDA tests' inputs for every op with a CUDA kernel: per op, a number of shape
// variants, each tried in every dtype the CUDA kernel registers and every layout, chosen so every
// kernel variant runs (cached and strided rows, fused backward chunks, tiled products, packed and
// strided elementwise paths, long reductions along and across the inner dimension).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>

#include "differential.h"

namespace opforge::emulated {

// A case: inputs for (dtype, shape variant, layout); `shapes` variants are tried in every layout
// the case has inputs for (nullopt: the variant skips that layout).
struct Case {
  int shapes;
  std::function<std::optional<Inputs>(DType, int, Layout, std::mt19937&)> inputs;
};

// Every op's case, by name (an op with a CUDA kernel and no case fails EveryCudaKernelHasACase).
const std::map<std::string, Case>& cases();

}  // namespace opforge::emulated
