// linear_act_backward on the CPU: g = grad * act'(z), then two blocked products
// (ops/linear_act/gemm-inl.h), grad_x = g @ weight and grad_weight = g^T @ x. z comes from preact
// (saved by linear_act_with_preact: g is one elementwise pass) or, without it, from a third
// product whose epilogue turns each tile into g; act='none' needs no z (g = grad). grad_bias sums
// g over rows by column blocks, each in row order: no thread-count dependence.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear_act_backward/linear_act_backward_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include <optional>
#include <type_traits>
#include <vector>

#include "opforge/cpu/scratch.h"
#include "opforge/cpu/visit.h"
#include "opforge/registry.h"
#include "opforge/simd.h"
#include "ops/linear_act/epilogue-inl.h"
#include "ops/linear_act/matmul-inl.h"
#include "ops/linear_act/linear_act.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::linear_act_backward_cpu::HWY_NAMESPACE {
using namespace opforge::gemm::HWY_NAMESPACE;

// A [rows, cols] view of t: its data as is where the leading dims step evenly, else a copy.
template <typename T>
Operand<T> Rows(const TensorView& t, int64_t rows, std::vector<T>& copy) {
  int64_t rs;
  if (linear_act::row_stride(t, &rs)) return {t.data_as<const T>(), rows, rs, t.stride(-1)};
  copy = linear_act::gather_rows<T>(t);
  return {copy.data(), rows, t.size(-1), 1};
}

// out[j] = sum over rows i of g[i * n + j], in row order.
template <typename T, typename C>
void SumRows(const C* g, int64_t m, int64_t n, T* out) {
  const hn::ScalableTag<C> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  constexpr int64_t kCols = 256;
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / (m * kCols + 1));
  parallel_for((n + kCols - 1) / kCols, grain, [&](int64_t begin, int64_t end) {
    HWY_ALIGN C sum[kCols];
    for (int64_t block = begin; block < end; ++block) {
      const int64_t j0 = block * kCols, cols = std::min(kCols, n - j0), vec_cols = cols / L * L;
      std::fill(sum, sum + kCols, C(0));
      for (int64_t i = 0; i < m; ++i) {
        const C* row = g + i * n + j0;
        int64_t j = 0;
        for (; j < vec_cols; j += L) hn::Store(hn::Add(hn::Load(d, sum + j), hn::LoadU(d, row + j)), d, sum + j);
        for (; j < cols; ++j) sum[j] += row[j];
      }
      for (int64_t j = 0; j < cols; ++j) out[j0 + j] = FromCompute<T>(sum[j]);
    }
  });
}

// D[a, b] = sum_p G(a, p) V(b, p) for the float G of g (G(a, p) = g[a * K + p], or g[p * rows + a]
// where transposed) on AMX tiles, G split into two bfloat16 parts (amx::split_gemm): bfloat16
// only, under AVX3 with AMX on. false: not taken (the caller runs Matmul).
template <typename T, typename C>
bool SplitProduct(const C* g, int64_t rows, int64_t K, bool transposed, const Operand<T>& v, const Epilogue<C>& epi) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (std::is_same_v<T, hwy::bfloat16_t>) {
    if (K < 1 || !amx_enabled()) return false;
    const linear_act::amx::Bf16Operand bits{reinterpret_cast<const uint16_t*>(v.data), v.rows, v.rs, v.ps};
    linear_act::amx::split_gemm(g, rows, K, transposed, bits, AmxBlocks(epi, false));
    return true;
  }
#endif
  (void)g, (void)rows, (void)K, (void)transposed, (void)v, (void)epi;
  return false;
}

// out = g (m x n, contiguous) rounded to T, rows in parallel.
template <typename T, typename C>
void RoundRows(const C* g, int64_t m, int64_t n, T* out) {
  parallel_for(m, std::max<int64_t>(1, (1 << 15) / (n + 1)), [&](int64_t begin, int64_t end) {
    const hn::ScalableTag<C> d;
    const int64_t L = static_cast<int64_t>(hn::Lanes(d));
    for (int64_t i = begin; i < end; ++i)
      for (int64_t j = 0; j < n; j += L) StoreN(d, LoadN(d, g + i * n + j, 1, n - j), out + i * n + j, 1, n - j);
  });
}

void Run(const KernelCall& call) {
  const TensorView& grad = call.tensor("grad");
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("weight");
  const TensorView* bias = call.optional_tensor("bias");
  cpu::visit_float(x.dtype, "linear_act_backward", [&](auto tag) {
    using T = decltype(tag);
    using C = Compute<T>;
    const int64_t k = x.size(-1), n = w.size(0);
    int64_t m = 1;
    for (int64_t dim = 0; dim + 1 < x.rank(); ++dim) m *= x.shape[dim];
    std::vector<T> x_copy, grad_copy;
    const Operand<T> xa = Rows(x, m, x_copy);
    const Operand<T> ga = Rows(grad, m, grad_copy);
    const Operand<T> wb{w.data_as<const T>(), n, w.stride(0), w.stride(1)};
    const auto bias_c = PaddedBias<T>(bias, n);

    const TensorView* preact = call.optional_tensor("preact");
    const cpu::BackendBuffer<C> g_buffer(std::max<int64_t>(1, m * n));  // reused memory from call to call
    C* g = g_buffer.get();
    const int64_t grain = std::max<int64_t>(1, 8192 / (n + 1));
    VisitAct(call.attr_str("act"), "linear_act_backward", [&](auto, auto act_grad) {
      if constexpr (std::is_same_v<decltype(act_grad), IdentityGrad>) {
        // bfloat16's products take grad itself (below): a float32 copy only for grad_bias.
        if (std::is_same_v<T, hwy::bfloat16_t> && !call.output(2).numel()) return;
        parallel_for(m, grain, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i)
            for (int64_t j = 0; j < n; ++j) g[i * n + j] = ToCompute(ga.data[i * ga.rs + j * ga.ps]);
        });
      } else if (preact) {
        std::vector<T> z_copy;
        const Operand<T> za = Rows(*preact, m, z_copy);
        parallel_for(m, grain, [&](int64_t begin, int64_t end) {
          const hn::ScalableTag<C> d;
          const int64_t L = static_cast<int64_t>(hn::Lanes(d));
          for (int64_t i = begin; i < end; ++i)
            for (int64_t j = 0; j < n; j += L) {
              const auto z = LoadN(d, za.data + i * za.rs + j * za.ps, za.ps, n - j);
              const auto gv = LoadN(d, ga.data + i * ga.rs + j * ga.ps, ga.ps, n - j);
              StoreN(d, act_grad(d, gv, z), g + i * n + j, 1, n - j);
            }
        });
      } else {
        const GradAct<T, decltype(act_grad)> epi(g, n, ga.data, ga.rs, ga.ps, bias_c.data(), act_grad);
        Matmul(xa, wb, k, epi);
      }
    });

    // g as the products take it: float32 (C), or bfloat16 (T) where that is exact (act="none": g
    // is grad) or asked for (bf16_grad_rounding_enabled()), so they run as bfloat16 products
    // (matmul-inl.h: AVX512_BF16 pairs or AMX tiles) with no split of a float32 g.
    std::optional<cpu::BackendBuffer<T>> rounded;
    Operand<T> low{nullptr, m, n, 1};  // g's rows, in T, when low.data
    if constexpr (std::is_same_v<T, hwy::bfloat16_t>) {
      if (call.attr_str("act") == "none") {
        low = ga;
      } else if (bf16_grad_rounding_enabled() && m * n > 0 && (call.output(0).numel() || call.output(1).numel())) {
        rounded.emplace(m * n);
        RoundRows(g, m, n, rounded->get());
        low.data = rounded->get();
      }
    }
    // The product of g (transposed: g^T) with v over K steps, into epi.
    const auto product = [&](bool transposed, const Operand<T>& v, int64_t K, const Epilogue<C>& epi) {
      const int64_t rows = transposed ? n : m;
      if (low.data) return Matmul(transposed ? Operand<T>{low.data, n, low.ps, low.rs} : low, v, K, epi);
      if (!SplitProduct<T>(g, rows, K, transposed, v, epi))
        Matmul(transposed ? Operand<C>{g, n, 1, n} : Operand<C>{g, m, n, 1}, v, K, epi);
    };

    // Only the results asked for (output_mask; the others are empty): the first layer needs
    // no grad_x, a frozen weight no grad_weight, each a third of the work.
    if (call.output(0).numel()) {
      const BiasAct<T, Identity> grad_x(call.output(0).data_as<T>(), k, nullptr, Identity{});
      product(false, Operand<T>{wb.data, k, wb.ps, wb.rs}, n, grad_x);
    }
    if (call.output(1).numel()) {
      const BiasAct<T, Identity> grad_w(call.output(1).data_as<T>(), k, nullptr, Identity{});
      product(true, Operand<T>{xa.data, k, xa.ps, xa.rs}, m, grad_w);
    }
    if (call.output(2).numel()) SumRows(g, m, n, call.output(2).data_as<T>());
  });
}

}  // namespace opforge::linear_act_backward_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::linear_act_backward_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(linear_act_backward, "cpu", float_dtypes(), run);
}  // namespace opforge::linear_act_backward_cpu
#endif
