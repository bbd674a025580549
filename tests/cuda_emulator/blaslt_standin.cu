// cuBLASLt in the emulated build: opforge/cuda/blaslt.h's matmul computed on the host (the emulated
// device's memory is the host's), in place of src/backends/cublaslt.cu. It declines what that file
// declines before it asks the library (a dtype it does not map, a bias it would read in the wrong
// type or unaligned, an operand strided in both dimensions or with overlapping rows), so the
// callers' paths around cuBLASLt run here: linear_act's finishing pass, the backward's half-type
// gradient in two parts accumulated with beta = 1. Off until a test turns it on.
#include <atomic>
#include <cstdint>
#include <string>

#include "opforge/cuda/blaslt.h"
#include "opforge/cuda/common.cuh"

namespace opforge::cuda::blaslt {

namespace {

std::atomic<bool> enabled{false};
std::atomic<int64_t> taken{0}, declined{0};

// cublaslt.cu's store(): element (r, p), r < count, p < k, must be a run along p (column stride 1,
// rows k or more apart) or along r; a stride over one element is arbitrary.
bool readable(Operand x, int64_t count, int64_t k) {
  int64_t rs = x.row_stride, cs = x.col_stride;
  if (count == 1) rs = cs == 1 ? k : 1;
  if (k == 1) cs = rs == 1 ? count : 1;
  return (cs == 1 && rs >= k) || (rs == 1 && cs >= count);
}

template <typename T, typename O>
void product(int64_t m, int64_t n, int64_t k, Operand a, Operand b, const T* bias, O* out, bool accumulate,
             double scale) {
  using A = Acc<T>;
  const T* pa = static_cast<const T*>(a.data);
  const T* pb = static_cast<const T*>(b.data);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      A sum = 0;
      for (int64_t p = 0; p < k; ++p)
        sum += A(pa[i * a.row_stride + p * a.col_stride]) * A(pb[j * b.row_stride + p * b.col_stride]);
      sum *= A(scale);
      if (bias) sum += A(bias[j]);
      if (accumulate) sum += A(out[i * n + j]);
      out[i * n + j] = static_cast<O>(sum);
    }
}

}  // namespace

bool matmul(const char*, DType dtype, int64_t m, int64_t n, int64_t k, Operand a, Operand b, const void* bias,
            void* out, DType out_dtype, void*, bool accumulate, double scale) {
  if (!enabled.load()) return false;
  const bool half = dtype == DType::float16 || dtype == DType::bfloat16;
  const bool accepted = m > 0 && n > 0 && k > 0 && (half || dtype == DType::float32 || dtype == DType::float64) &&
                        (out_dtype == dtype || (half && out_dtype == DType::float32)) &&
                        !(bias && (out_dtype != dtype || reinterpret_cast<uintptr_t>(bias) % 16)) &&
                        readable(b, n, k) && readable(a, m, k);
  ++(accepted ? taken : declined);
  if (!accepted) return false;
  visit(dtype, "matmul", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<Acc<T>>) {
      if (out_dtype == dtype)
        product<T>(m, n, k, a, b, static_cast<const T*>(bias), static_cast<T*>(out), accumulate, scale);
      else
        product<T>(m, n, k, a, b, static_cast<const T*>(bias), static_cast<float*>(out), accumulate, scale);
    }
  });
  return true;
}

Calls calls() { return {taken.load(), declined.load()}; }
std::string status() { return enabled.load() ? "emulated on the host" : "emulated on the host, turned off"; }
bool set_enabled(bool on) { return enabled.exchange(on); }
bool ready() { return enabled.load(); }

}  // namespace opforge::cuda::blaslt
