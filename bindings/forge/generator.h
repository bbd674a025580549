// forge's random number generators. A forge generator wraps a CPU generator (same engine, same
// state format), because forge's random kernels are the CPU ones run on forge memory; the CPU
// kernels only accept a generator whose device is the CPU, so they are handed the inner one.
#pragma once

#include <ATen/core/Generator.h>

#include <optional>

namespace opforge::forge {

const at::Generator& default_generator(int device);
at::Generator make_generator(int device);
// The CPU generator to use for a forge random op on `device`: the inner one of `gen` when the
// caller passed a forge generator, else of the device's default. TypeError for other devices.
at::Generator cpu_generator_for(const std::optional<at::Generator>& gen, int device);

}  // namespace opforge::forge
