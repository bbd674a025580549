// bfloat16 results stored by AVX512_BF16's conversion (opforge/simd.h, bf16_convert_enabled) and
// by the software rounding, bit for bit against half.h's scalar rounding of the same float: ties
// (about one product in 256 of two random bfloat16 values), subnormal products (the instruction
// flushes those, so their vectors must take the software path), NaNs, infinities, zeros of both
// signs, products that round up to infinity. mul is the vehicle: a product of two bfloat16 values
// is exact in float, so the only rounding is the store's. Rows of a whole vector, of half a
// vector (MapRowPairs: two rows to a vector) and narrower, on every target; the hardware path
// runs where the CPU has it (elsewhere both runs are the software rounding).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "opforge/half.h"
#include "opforge/simd.h"
#include "test_util.h"

namespace opforge {
namespace {

using testing::run_op;
using testing::view;

bfloat16 bits(uint16_t b) { return bfloat16{b}; }

// Factors whose products cover the cases above, shuffled among ordinary ones.
std::vector<bfloat16> factors(int64_t n, uint32_t seed, bool second) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<bfloat16> v(n);
  for (int64_t i = 0; i < n; ++i) {
    float x = normal(rng);
    switch (rng() % 16) {
      case 0: x *= second ? 3e-20f : 2e-19f; break;                  // products of ~1e-39: subnormal
      case 1: x = second ? 0.5f : 2.3509887e-38f * (1 + x / 8); break;  // around the smallest normal
      case 2: x *= second ? 1.5f : 2e38f; break;                     // near and past the largest finite
      // NaNs in the first factor only: which of two NaNs a product keeps is the compiler's choice.
      case 3: x = std::vector<float>{0.f, -0.f, inf, -inf, NAN, -NAN}[rng() % (second ? 4 : 6)]; break;
      case 4:
        if (second) break;
        v[i] = bits(uint16_t((rng() % 2 ? 0xff81 : 0x7f81) + rng() % 0x7e));  // payloads, signaling or quiet
        continue;
      default: break;
    }
    v[i] = to_bfloat16(x);
  }
  return v;
}

class Bf16Convert : public testing::OnEachTargetOneThread {
 protected:
  void TearDown() override {
    set_bf16_convert_enabled(was_enabled_);
    testing::OnEachTargetOneThread::TearDown();
  }

 private:
  bool was_enabled_ = bf16_convert_enabled();
};

// mul of [rows, width] views of rows `pitch` apart, against half.h's rounding of each product.
void expect_products_round(int64_t rows, int64_t width, int64_t pitch, uint32_t seed) {
  const int64_t span = rows * pitch;
  std::vector<bfloat16> a = factors(span, seed, false), b = factors(span, seed + 1, true);
  const Dims shape{rows, width}, strides{pitch, 1};
  OpInputs in;
  in.tensors = {view(a, DType::bfloat16, shape, strides), view(b, DType::bfloat16, shape, strides)};
  const std::vector<bfloat16> got = run_op("mul", in).as<bfloat16>();
  int64_t wrong = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c) {
      const int64_t i = r * pitch + c;
      const uint16_t want = to_bfloat16(to_float(a[i]) * to_float(b[i])).bits, have = got[r * width + c].bits;
      if (want != have && ++wrong <= 5)
        ADD_FAILURE() << "[" << r << ", " << c << "] of " << rows << " x " << width << ": "
                      << to_float(a[i]) << " * " << to_float(b[i]) << " stored as 0x" << std::hex << have
                      << ", want 0x" << want << std::dec;
    }
  EXPECT_EQ(wrong, 0);
}

TEST_P(Bf16Convert, ProductsRoundAsTheScalarRounding) {
  for (bool hardware : {true, false}) {
    set_bf16_convert_enabled(hardware);
    SCOPED_TRACE(hardware && bf16_convert_enabled() ? "AVX512_BF16 conversion" : "software rounding");
    expect_products_round(1, 40000, 40000, 1);  // whole vectors, then a tail
    expect_products_round(3000, 8, 24, 2);      // half an AVX-512 vector per row
    expect_products_round(3000, 4, 12, 3);      // a quarter
    expect_products_round(1000, 3, 8, 4);       // odd widths
  }
}

// The switch: off always works, on only where the CPU has the instruction.
TEST(Bf16ConvertSwitch, FollowsTheCpu) {
  const bool was_enabled = bf16_convert_enabled();
  set_bf16_convert_enabled(false);
  EXPECT_FALSE(bf16_convert_enabled());
  set_bf16_convert_enabled(true);
  EXPECT_EQ(bf16_convert_enabled(), bf16_convert_supported());
  set_bf16_convert_enabled(was_enabled);
}

INSTANTIATE_TEST_SUITE_P(EveryTarget, Bf16Convert, ::testing::ValuesIn(simd_targets_supported()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace opforge
