// matmul_q's SIMD paths called directly (ops/matmul_q/matmul_q.h), each against the scalar
// reference bit for bit: on x86 pmaddubsw (AVX2), AVX-VNNI's and AVX-512 VNNI's vpdpbusd, on Arm
// SDOT, each where this CPU has it. The op picks one path per SIMD target, so on a CPU with
// AVX-VNNI the Python tests never reach pmaddubsw; here every path runs, unpacked (up to
// kMaxFewRows rows) and packed, over partial tiles and block chunks, with any weight byte.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "opforge/half.h"
#include "ops/matmul_q/matmul_q.h"

namespace {

using namespace opforge;
using namespace opforge::matmul_q;

struct Product {
  std::vector<uint8_t> w;
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> sum;
  Activations a;
  Weights weights;
};

// Random weight bytes with fp16 scales of 1e-3 to 1e-1, and x as the quantizer leaves it (quants
// of -127..127, fp16-valued scales, each block's quant sum).
Product random_product(quant::Format format, int64_t m, int64_t n, int64_t nb, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> scale(1e-3f, 1e-1f);
  const int64_t bytes = quant::block_bytes(format);
  Product p;
  p.w.resize(n * nb * bytes);
  for (uint8_t& b : p.w) b = static_cast<uint8_t>(gen());
  for (int64_t blk = 0; blk < n * nb; ++blk) {
    const float16 h = to_float16(scale(gen));
    std::memcpy(&p.w[blk * bytes], &h.bits, 2);
  }
  p.q.resize(m * nb * quant::kBlock);
  p.d.resize(m * nb);
  p.sum.assign(m * nb, 0);
  for (int64_t g = 0; g < m * nb; ++g) {
    for (int64_t j = 0; j < quant::kBlock; ++j)
      p.sum[g] += (p.q[g * quant::kBlock + j] = static_cast<int8_t>(static_cast<int>(gen() % 255) - 127));
    p.d[g] = to_float(to_float16(scale(gen)));
  }
  p.a = {p.q.data(), p.d.data(), p.sum.data(), m, nb};
  p.weights = {p.w.data(), n, nb, nb * bytes, format};
  return p;
}

using Path = void (*)(const Activations&, const Weights&, float*);

// Every path in `paths` gives gemm_scalar's bits: 1 to 70 rows, partial tiles, 1 and 33 blocks.
void expect_scalar_bits(const std::vector<std::pair<std::string, Path>>& paths) {
  unsigned seed = 0;
  for (const quant::Format format : {quant::Format::q8_0, quant::Format::q4_0})
    for (const int64_t m : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, int64_t{8}, int64_t{9}, int64_t{70}})
      for (const int64_t n : {int64_t{1}, int64_t{13}, int64_t{40}})
        for (const int64_t nb : {int64_t{1}, int64_t{33}}) {
          const Product p = random_product(format, m, n, nb, ++seed);
          std::vector<float> want(m * n), got(m * n);
          gemm_scalar(p.a, p.weights, want.data());
          for (const auto& [name, path] : paths) {
            std::fill(got.begin(), got.end(), -1.0f);
            path(p.a, p.weights, got.data());
            ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
                << name << ", " << quant::format_name(format) << ", m " << m << ", n " << n << ", " << nb << " blocks";
          }
        }
}

#if defined(__x86_64__) || defined(__i386__)
TEST(MatmulQPaths, EveryX86PathGivesTheScalarBits) {
  static_assert(kMaxFewRows == 8, "the rows above straddle the unpacked kernels' limit");
  std::vector<std::pair<std::string, Path>> paths;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    paths.emplace_back("pmaddubsw (AVX2)", gemm_avx2);
  if (cpu_has_avx_vnni()) paths.emplace_back("AVX-VNNI", gemm_avx_vnni);
  if (cpu_has_avx512_vnni()) paths.emplace_back("AVX-512 VNNI", gemm_vnni);
  if (paths.empty()) GTEST_SKIP() << "this CPU has none of matmul_q's x86 paths";
  expect_scalar_bits(paths);
}
#endif

#if defined(__aarch64__) && defined(__linux__)
TEST(MatmulQPaths, ArmDotProductGivesTheScalarBits) {
  if (!cpu_has_arm_dotprod()) GTEST_SKIP() << "this CPU has no SDOT (Armv8.2 dot product)";
  expect_scalar_bits({{"SDOT", gemm_arm_dotprod}});
}
#endif

}  // namespace
