// The CPU activations (and linear_act's epilogue, which uses them) on inputs where a careless
// evaluation makes subnormal floats on the way to a normal result: exp at its flush point
// (|x| past ~87 in silu, -x^2/2 past it in gelu, the tanh form's 2u past it for x near -10),
// Phi(x) for x in [-13.1, -12.8]. Every x86
// instruction that makes or reads a subnormal float takes a microcode assist (~150 cycles on
// Intel); that once made gelu 10x slower on such inputs, with the right results. The x86 status
// flags record it: after each op here the underflow and denormal-operand flags must still be
// clear. One thread, so the kernels run on the thread whose flags are read.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "opforge/parallel.h"
#include "opforge/simd.h"
#include "test_util.h"

#if defined(__x86_64__) || defined(__i386__)  // the whole file: it reads the x86 MXCSR flags
#include <xmmintrin.h>

namespace opforge {
namespace {

using testing::run_op;
using testing::view;

// Values from each band, shuffled among ordinary ones, so every vector mixes them.
std::vector<float> hard_inputs(int64_t n, uint32_t seed) {
  // Phi subnormal; exp flushed in gelu; exp near and past its flush in silu and gelu's tanh form.
  const double bands[][2] = {{-13.1, -12.8}, {12.8, 13.4}, {-60, -14}, {14, 60}, {-100, -86},
                             {86, 100}, {-10.2, -9.5}, {-3, 3}};
  std::mt19937 rng(seed);
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) {
    const auto& band = bands[rng() % std::size(bands)];
    x[i] = static_cast<float>(std::uniform_real_distribution<double>(band[0], band[1])(rng));
  }
  return x;
}

class NoSubnormals : public testing::OnEachTargetOneThread {};

constexpr unsigned kDenormalOperand = 1u << 1, kUnderflow = 1u << 4;

// The op's flags: underflow / denormal-operand raised while it ran. Flush-to-zero is on
// meanwhile: without it an exact subnormal result (which takes the assist all the same) raises
// no underflow flag; with it every tiny result does.
template <class F>
unsigned flags_raised(F run) {
  constexpr unsigned kFlushToZero = 1u << 15, kFlags = 0x3f;
  const unsigned saved = _mm_getcsr();
  _mm_setcsr((saved & ~kFlags) | kFlushToZero);
  run();
  const unsigned raised = _mm_getcsr() & (kDenormalOperand | kUnderflow);
  _mm_setcsr(saved);
  return raised;
}

TEST_P(NoSubnormals, Activations) {
  const int64_t n = 4099;
  std::vector<float> x = hard_inputs(n, 7), g(n);
  std::mt19937 rng(8);
  for (auto& v : g) v = std::uniform_real_distribution<float>(1, 2)(rng);  // keeps g * gelu'(x) normal
  const auto xv = view(x, DType::float32, {n}), gv = view(g, DType::float32, {n});
  const std::pair<const char*, OpInputs> cases[] = {
      {"gelu", {{xv}, {std::string("none")}}},
      {"gelu_backward", {{gv, xv}, {std::string("none")}}},
      {"gelu (tanh)", {{xv}, {std::string("tanh")}}},
      {"gelu_backward (tanh)", {{gv, xv}, {std::string("tanh")}}},
      {"silu", {{xv}, {}}},
      {"silu_backward", {{gv, xv}, {}}},
  };
  for (const auto& [op, inputs] : cases) {
    const std::string name = op;
    const unsigned raised = flags_raised([&] { run_op(name.substr(0, name.find(' ')), inputs); });
    EXPECT_EQ(raised, 0u) << op << ": underflow " << bool(raised & kUnderflow) << ", subnormal operand "
                          << bool(raised & kDenormalOperand);
  }
}

// linear_act's gelu and silu epilogues, on an identity product (x @ I^T = x exactly).
TEST_P(NoSubnormals, LinearActEpilogues) {
  const int64_t m = 5, k = 64;
  std::vector<float> x = hard_inputs(m * k, 9), w(k * k, 0.0f);
  for (int64_t i = 0; i < k; ++i) w[i * k + i] = 1.0f;
  for (const char* act : {"gelu", "silu"}) {
    const OpInputs inputs{{view(x, DType::float32, {m, k}), view(w, DType::float32, {k, k}), std::nullopt},
                          {std::string(act)}};
    const unsigned raised = flags_raised([&] { run_op("linear_act", inputs); });
    EXPECT_EQ(raised, 0u) << act << ": underflow " << bool(raised & kUnderflow) << ", subnormal operand "
                          << bool(raised & kDenormalOperand);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryTarget, NoSubnormals, ::testing::ValuesIn(simd_targets_supported()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace opforge
#endif
