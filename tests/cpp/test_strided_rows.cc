// Elementwise ops on rows with a stride other than 1 (x[..., ::2], x[..., ::3], reversed), which
// the CPU kernels read as whole vectors (StridedRow: stride 2 deinterleaves loads that reach one
// element past the vector, other strides gather): against the same op on a contiguous copy, bit
// for bit, in every float dtype on every SIMD target, for every row length up to a few vectors,
// each input's last element the last before a page the test has made unreadable, so a read past a
// row faults.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "opforge/half.h"
#include "test_util.h"

namespace opforge {
namespace {

using testing::run_op;
using testing::view;

// `bytes` of memory whose end is followed by an inaccessible page.
class PageEnd {
 public:
  explicit PageEnd(size_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    span_ = (bytes + page - 1) / page * page + page;
    base_ = static_cast<char*>(mmap(nullptr, span_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    EXPECT_NE(base_, MAP_FAILED);
    EXPECT_EQ(mprotect(base_ + span_ - page, page, PROT_NONE), 0);
    data_ = base_ + span_ - page - bytes;
  }
  ~PageEnd() { munmap(base_, span_); }
  void* data() const { return data_; }

 private:
  char* base_;
  char* data_;
  size_t span_;
};

class StridedRows : public testing::OnEachTargetOneThread {};

// Row-major values of `op` on n values per input, input k read as a row with strides[k] whose
// last element ends at a page (reversed rows start there) and as a contiguous copy.
double as_double(float v) { return v; }
double as_double(double v) { return v; }
double as_double(float16 v) { return to_float(v); }
double as_double(bfloat16 v) { return to_float(v); }
template <typename T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, float16>) return to_float16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bfloat16>) return to_bfloat16(static_cast<float>(v));
  else return static_cast<T>(v);
}

template <typename T>
void expect_strided_equals_contiguous(const std::string& op, int inputs, int64_t n, Dims strides,
                                      std::mt19937& rng) {
  constexpr DType dtype = testing::dtype_of<T>();
  std::vector<std::unique_ptr<PageEnd>> pages;
  std::vector<std::vector<T>> copies(inputs, std::vector<T>(n));
  OpInputs strided, contiguous;
  for (int k = 0; k < inputs; ++k) {
    const int64_t stride = strides[k], span = (n - 1) * (stride < 0 ? -stride : stride) + 1;
    pages.push_back(std::make_unique<PageEnd>(span * sizeof(T)));
    T* p = static_cast<T*>(pages.back()->data());
    for (int64_t e = 0; e < span; ++e) p[e] = from_double<T>(std::normal_distribution<double>(0, 2)(rng));
    T* first = stride < 0 ? p + span - 1 : p;
    for (int64_t i = 0; i < n; ++i) copies[k][i] = first[i * stride];
    strided.tensors.emplace_back(view(first, dtype, {n}, {stride}));
    contiguous.tensors.emplace_back(view(copies[k], dtype, {n}));
  }
  testing::add_default_attrs(op, strided);
  testing::add_default_attrs(op, contiguous);
  const auto got = run_op(op, strided).as<T>(), want = run_op(op, contiguous).as<T>();
  ASSERT_EQ(got.size(), want.size());
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(T)), 0)
        << op << " n=" << n << " strides " << ::testing::PrintToString(strides) << " element " << i << ": "
        << as_double(got[i]) << " vs " << as_double(want[i]);
}

TEST_P(StridedRows, EqualContiguousCopiesAndStayInsideTheirRows) {
  std::mt19937 rng(17);
  const std::pair<const char*, int> ops[] = {{"relu", 1},   {"gelu", 1},  {"silu", 1},          {"add_one", 1},
                                             {"add", 2},    {"mul", 2},   {"gelu_backward", 2}, {"relu_backward", 2}};
  for (const auto& [op, inputs] : ops)
    // Both operands of a binary op strided, or one strided beside a contiguous or broadcast one.
    for (const Dims& strides : std::vector<Dims>{{2, 2}, {3, 3}, {-2, -2}, {2, 1},
                                                  {1, 3}, {0, 2}, {-2, 0}})
      for (int64_t n = 1; n <= 40; ++n) {
        if (inputs == 1 && strides[0] != strides[1]) continue;
        expect_strided_equals_contiguous<float>(op, inputs, n, strides, rng);
        expect_strided_equals_contiguous<double>(op, inputs, n, strides, rng);
        expect_strided_equals_contiguous<float16>(op, inputs, n, strides, rng);
        expect_strided_equals_contiguous<bfloat16>(op, inputs, n, strides, rng);
      }
}

INSTANTIATE_TEST_SUITE_P(EveryTarget, StridedRows, ::testing::ValuesIn(simd_targets_supported()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace opforge
