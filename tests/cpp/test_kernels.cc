// The CPU kernels of add, add_one and rms_norm on every SIMD target this CPU supports,
// against naive references: float math for the exactly-rounded elementwise ops, double for
// rms_norm. Odd sizes put work in both the SIMD body and the scalar tail.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "opforge/half.h"
#include "opforge/simd.h"
#include "test_util.h"

namespace opforge {
namespace {

using testing::run_op;
using testing::throws;
using testing::view;

const int64_t kSizes[] = {1, 7, 33, 4097};

template <typename T>
std::vector<T> random_values(int64_t n, uint32_t seed, double lo = -4, double hi = 4) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(rng));
  return v;
}

// Runs the test body once per supported target, pinned, then restores automatic choice.
class Kernels : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    set_simd_target(GetParam());
    ASSERT_EQ(simd_target_chosen(), GetParam());
  }
  void TearDown() override { set_simd_target(""); }
};

template <typename T>
void check_add_one(DType dtype, uint32_t seed) {
  for (int64_t n : kSizes) {
    std::vector<T> x = random_values<T>(n, seed + n);
    std::vector<T> out = run_op("add_one", {{view(x, dtype, {n})}, {}}).template as<T>();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], x[i] + T(1)) << "n=" << n << " i=" << i;
  }
}

TEST_P(Kernels, AddOne) {
  check_add_one<float>(DType::float32, 1);
  check_add_one<double>(DType::float64, 2);
}

TEST_P(Kernels, AddOneIntegersAndStrided) {
  std::vector<int64_t> ints{-3, 0, 41, int64_t{1} << 40, -1, 7, 9};
  EXPECT_EQ(run_op("add_one", {{view(ints, DType::int64, {7})}, {}}).as<int64_t>(),
            (std::vector<int64_t>{-2, 1, 42, (int64_t{1} << 40) + 1, 0, 8, 10}));
  // A transposed 33x7 view: the output is contiguous in the view's (transposed) order.
  std::vector<float> x = random_values<float>(33 * 7, 3);
  std::vector<float> out = run_op("add_one", {{view(x, DType::float32, {7, 33}, {1, 7})}, {}}).as<float>();
  for (int64_t i = 0; i < 7; ++i)
    for (int64_t j = 0; j < 33; ++j) ASSERT_EQ(out[i * 33 + j], x[j * 7 + i] + 1.0f);
}

TEST_P(Kernels, AddOneHalfTypesRoundLikeTheScalarPath) {
  // x + 1 is exact in float for these inputs, so the only rounding is the store: the SIMD
  // demotion must give the same bits as the scalar RNE conversion.
  for (int64_t n : kSizes) {
    std::vector<float> src = random_values<float>(n, 40 + n, -300, 300);
    std::vector<uint16_t> h(n), b(n);
    for (int64_t i = 0; i < n; ++i) h[i] = to_float16(src[i]).bits, b[i] = to_bfloat16(src[i]).bits;
    auto oh = run_op("add_one", {{view(h, DType::float16, {n})}, {}}).as<uint16_t>();
    auto ob = run_op("add_one", {{view(b, DType::bfloat16, {n})}, {}}).as<uint16_t>();
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(oh[i], to_float16(to_float(float16{h[i]}) + 1.0f).bits) << "float16 n=" << n << " i=" << i;
      ASSERT_EQ(ob[i], to_bfloat16(to_float(bfloat16{b[i]}) + 1.0f).bits) << "bfloat16 n=" << n << " i=" << i;
    }
  }
}

// add over `xs` x `ys` shapes; checks every element against x[i'] + y[j'] by index math.
template <typename T>
void check_add(DType dtype, Dims xs, Dims ys, uint32_t seed) {
  SCOPED_TRACE(::testing::PrintToString(xs) + " + " + ::testing::PrintToString(ys));
  // Both are rank 2 here (size 1 broadcasts), which keeps the reference indexing plain.
  std::vector<T> x = random_values<T>(xs[0] * xs[1], seed), y = random_values<T>(ys[0] * ys[1], seed + 1);
  testing::Result r = run_op("add", {{view(x, dtype, xs), view(y, dtype, ys)}, {}});
  const int64_t rows = std::max(xs[0], ys[0]), cols = std::max(xs[1], ys[1]);
  ASSERT_EQ(r.specs[0].shape, (Dims{rows, cols}));
  std::vector<T> out = r.as<T>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const T a = x[(xs[0] == 1 ? 0 : i) * xs[1] + (xs[1] == 1 ? 0 : j)];
      const T b = y[(ys[0] == 1 ? 0 : i) * ys[1] + (ys[1] == 1 ? 0 : j)];
      ASSERT_EQ(out[i * cols + j], T(a + b)) << i << ", " << j;
    }
}

TEST_P(Kernels, Add) {
  for (int64_t n : kSizes) {
    check_add<float>(DType::float32, {3, n}, {3, n}, 10);   // same shape
    check_add<float>(DType::float32, {3, n}, {1, n}, 11);   // row broadcast
    check_add<float>(DType::float32, {3, n}, {1, 1}, 12);   // scalar broadcast
    check_add<float>(DType::float32, {1, 1}, {2, n}, 13);   // scalar on the left
    check_add<float>(DType::float32, {3, 1}, {1, n}, 14);   // outer sum: both strided
    check_add<double>(DType::float64, {2, n}, {2, n}, 15);
    check_add<double>(DType::float64, {2, n}, {1, n}, 16);
    check_add<int32_t>(DType::int32, {2, n}, {1, n}, 17);
  }
  // Big enough that the thread pool splits the rows.
  check_add<float>(DType::float32, {17, 4097}, {1, 4097}, 18);
}

TEST_P(Kernels, AddTransposed) {
  const int64_t r = 33, c = 7;
  std::vector<float> x = random_values<float>(r * c, 20), y = random_values<float>(r * c, 21);
  // y is stored c x r and viewed r x c.
  auto out = run_op("add", {{view(x, DType::float32, {r, c}), view(y, DType::float32, {r, c}, {1, r})}, {}}).as<float>();
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) ASSERT_EQ(out[i * c + j], x[i * c + j] + y[j * r + i]);
}

// rms_norm against a float64 reference, rows x n.
template <typename T>
void check_rms_norm(DType dtype, int64_t rows, int64_t n, double eps, double tol, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " rows=" << rows << " n=" << n);
  std::vector<T> x = random_values<T>(rows * n, seed), w = random_values<T>(n, seed + 1, 0.5, 1.5);
  std::vector<T> out = run_op("rms_norm", {{view(x, dtype, {rows, n}), view(w, dtype, {n})}, {eps}}).template as<T>();
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[r * n + i]) * double(x[r * n + i]);
    const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
    for (int64_t i = 0; i < n; ++i) {
      const double want = double(x[r * n + i]) * inv * double(w[i]);
      ASSERT_NEAR(double(out[r * n + i]), want, tol * (1 + std::abs(want))) << r << ", " << i;
    }
  }
}

TEST_P(Kernels, RmsNorm) {
  for (int64_t n : kSizes) {
    check_rms_norm<float>(DType::float32, 3, n, 1e-6, 1e-5, 30);
    check_rms_norm<double>(DType::float64, 3, n, 1e-6, 1e-13, 31);
    check_rms_norm<float>(DType::float32, 1, n, 0.5, 1e-5, 32);  // a large eps matters
  }
  check_rms_norm<float>(DType::float32, 64, 4097, 1e-5, 1e-5, 33);  // rows across threads
}

TEST_P(Kernels, RmsNormStridedRowsAndWeight) {
  // x is the transpose of a contiguous n x rows buffer; weight takes every other element.
  const int64_t rows = 5, n = 33;
  std::vector<float> x = random_values<float>(rows * n, 50), w = random_values<float>(2 * n, 51, 0.5, 1.5);
  auto out = run_op("rms_norm", {{view(x, DType::float32, {rows, n}, {1, rows}), view(w, DType::float32, {n}, {2})},
                                 {1e-6}})
                 .as<float>();
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[i * rows + r]) * x[i * rows + r];
    const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
    for (int64_t i = 0; i < n; ++i) {
      const double want = double(x[i * rows + r]) * inv * w[2 * i];
      ASSERT_NEAR(out[r * n + i], want, 1e-5 * (1 + std::abs(want))) << r << ", " << i;
    }
  }
}

TEST_P(Kernels, RmsNormHalfTypes) {
  // Inputs rounded to the half type first, so the reference sees the same values.
  for (int64_t n : kSizes) {
    std::vector<float> xf = random_values<float>(2 * n, 60 + n), wf = random_values<float>(n, 61, 0.5, 1.5);
    std::vector<uint16_t> xh(2 * n), wh(n), xb(2 * n), wb(n);
    for (int64_t i = 0; i < 2 * n; ++i) xh[i] = to_float16(xf[i]).bits, xb[i] = to_bfloat16(xf[i]).bits;
    for (int64_t i = 0; i < n; ++i) wh[i] = to_float16(wf[i]).bits, wb[i] = to_bfloat16(wf[i]).bits;
    auto oh = run_op("rms_norm", {{view(xh, DType::float16, {2, n}), view(wh, DType::float16, {n})}, {1e-6}}).as<uint16_t>();
    auto ob = run_op("rms_norm", {{view(xb, DType::bfloat16, {2, n}), view(wb, DType::bfloat16, {n})}, {1e-6}}).as<uint16_t>();
    for (int64_t r = 0; r < 2; ++r) {
      double sh = 0, sb = 0;
      for (int64_t i = 0; i < n; ++i) {
        sh += std::pow(double(to_float(float16{xh[r * n + i]})), 2);
        sb += std::pow(double(to_float(bfloat16{xb[r * n + i]})), 2);
      }
      const double ih = 1 / std::sqrt(sh / n + 1e-6), ib = 1 / std::sqrt(sb / n + 1e-6);
      for (int64_t i = 0; i < n; ++i) {
        const double want_h = to_float(float16{xh[r * n + i]}) * ih * to_float(float16{wh[i]});
        const double want_b = to_float(bfloat16{xb[r * n + i]}) * ib * to_float(bfloat16{wb[i]});
        // One rounding to the half type (2^-11, 2^-8 relative) plus float error.
        ASSERT_NEAR(to_float(float16{oh[r * n + i]}), want_h, 1e-3 * (1 + std::abs(want_h)));
        ASSERT_NEAR(to_float(bfloat16{ob[r * n + i]}), want_b, 8e-3 * (1 + std::abs(want_b)));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryTarget, Kernels, ::testing::ValuesIn(simd_targets_supported()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(SimdTargets, ListsAndPinning) {
  const auto supported = simd_targets_supported();
  const auto compiled = simd_targets_compiled();
  ASSERT_FALSE(supported.empty());
  for (const auto& t : supported)
    EXPECT_NE(std::find(compiled.begin(), compiled.end(), t), compiled.end()) << t;
  EXPECT_EQ(simd_target_chosen(), supported.front());  // automatic choice is the best
  EXPECT_TRUE(throws([] { set_simd_target("bogus"); }, ErrorKind::value,
                     "set_simd_target(): 'name' must be one of the targets this CPU supports [" +
                         supported.front()));
  EXPECT_TRUE(throws([] { set_simd_target("bogus"); }, ErrorKind::value, "], got 'bogus'"));
  set_simd_target(supported.back());
  EXPECT_EQ(simd_target_chosen(), supported.back());
  EXPECT_EQ(simd_targets_supported(), supported);  // pinning does not shrink the list
  set_simd_target("");
  EXPECT_EQ(simd_target_chosen(), supported.front());
}

}  // namespace
}  // namespace opforge
