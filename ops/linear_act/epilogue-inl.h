// linear_act's epilogues: what happens to a finished tile of x @ weight^T while it is in L1.
// Forward: + bias, activation, round to the output dtype, store. Backward: the same sums become
// grad * act'(z) (kept in the compute type for the two products that follow). Re-included
// once per Highway target.
#if defined(OPFORGE_OPS_LINEAR_ACT_EPILOGUE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_OPS_LINEAR_ACT_EPILOGUE_INL_H_
#undef OPFORGE_OPS_LINEAR_ACT_EPILOGUE_INL_H_
#else
#define OPFORGE_OPS_LINEAR_ACT_EPILOGUE_INL_H_
#endif

#include <hwy/highway.h>

#include <string>
#include <vector>

#include "opforge/cpu/activation-inl.h"
#include "opforge/error.h"
#include "ops/linear_act/gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::gemm::HWY_NAMESPACE {

struct Identity {
  template <class D, class V>
  HWY_INLINE V operator()(D, V x) const { return x; }
};
struct IdentityGrad {
  template <class D, class V>
  HWY_INLINE V operator()(D, V g, V) const { return g; }
};

// Calls f(forward functor, gradient functor) for linear_act's `act` attribute.
template <class F>
void VisitAct(const std::string& act, const char* op, F&& f) {
  using namespace cpu::HWY_NAMESPACE;
  if (act == "none") return f(Identity{}, IdentityGrad{});
  if (act == "relu") return f(Relu{}, ReluGrad{});
  if (act == "gelu") return f(GeluErf{}, GeluErfGrad{});
  if (act == "gelu_tanh") return f(GeluTanh{}, GeluTanhGrad{});
  if (act == "silu") return f(Silu{}, SiluGrad{});
  fail(ErrorKind::value, op, "(): 'act' must be one of 'none', 'relu', 'gelu', 'gelu_tanh', 'silu', got '", act, "'");
}

// The bias as Compute values, padded with zeros by two vectors so whole-vector loads past n stay
// inside; all zeros without a bias.
template <typename T>
std::vector<Compute<T>> PaddedBias(const TensorView* bias, int64_t n) {
  const int64_t pad = 2 * HWY_MAX_BYTES / sizeof(Compute<T>);
  std::vector<Compute<T>> out(n + pad, Compute<T>(0));
  if (bias)
    for (int64_t j = 0; j < n; ++j) out[j] = ToCompute(bias->data_as<const T>()[j * bias->stride(0)]);
  return out;
}

// out[a, b] = act(D[a, b] + bias[b]), out row-major with `ldo` elements per row; with `preact`
// (same layout as out), also preact[a, b] = D[a, b] + bias[b], rounded alike.
template <typename T, class Act>
class BiasAct final : public Epilogue<Compute<T>> {
  using C = Compute<T>;

 public:
  BiasAct(T* out, int64_t ldo, const C* bias, Act act, T* preact = nullptr)
      : out_(out), preact_(preact), ldo_(ldo), bias_(bias), act_(act) {}

  void Row(int64_t a, int64_t b0, const C* vals, int64_t count) const override {
    const hn::ScalableTag<C> d;
    const int64_t L = static_cast<int64_t>(hn::Lanes(d));
    for (int64_t i = 0; i < count; i += L) {
      auto v = hn::LoadU(d, vals + i);
      if (bias_) v = hn::Add(v, hn::LoadU(d, bias_ + b0 + i));
      if (preact_) StoreN(d, v, preact_ + a * ldo_ + b0 + i, 1, count - i);
      StoreN(d, act_(d, v), out_ + a * ldo_ + b0 + i, 1, count - i);
    }
  }

  // The bias (one value per column) and act along the columns in place, then a transposing copy
  // (with preact: the sums are copied out before act).
  void Cols(int64_t a0, int64_t b0, C* vals, int64_t ld, int64_t na, int64_t nb) const override {
    const hn::ScalableTag<C> d;
    const int64_t L = static_cast<int64_t>(hn::Lanes(d));
    for (int64_t j = 0; j < nb; ++j) {
      const auto vb = hn::Set(d, bias_ ? bias_[b0 + j] : C(0));
      C* col = vals + j * ld;
      for (int64_t i = 0; i < na; i += L) {
        const auto v = hn::Add(hn::Load(d, col + i), vb);
        hn::Store(preact_ ? v : act_(d, v), d, col + i);
      }
    }
    if (preact_) {
      CopyTransposed(preact_, a0, b0, vals, ld, na, nb);
      for (int64_t j = 0; j < nb; ++j)
        for (int64_t i = 0; i < na; i += L) hn::Store(act_(d, hn::Load(d, vals + j * ld + i)), d, vals + j * ld + i);
    }
    CopyTransposed(out_, a0, b0, vals, ld, na, nb);
  }

 private:
  void CopyTransposed(T* to, int64_t a0, int64_t b0, const C* vals, int64_t ld, int64_t na, int64_t nb) const {
    for (int64_t i = 0; i < na; ++i) {
      T* row = to + (a0 + i) * ldo_ + b0;
      for (int64_t j = 0; j < nb; ++j) row[j] = FromCompute<T>(vals[j * ld + i]);
    }
  }

  T* out_;
  T* preact_;  // nullptr: not wanted
  int64_t ldo_;
  const C* bias_;
  Act act_;
};

// g[a, b] = grad[a, b] * act'(D[a, b] + bias[b]), g row-major Compute values with `ldg` per row;
// grad's element (a, b) at grad[a * gs_a + b * gs_b].
template <typename T, class ActGrad>
class GradAct final : public Epilogue<Compute<T>> {
  using C = Compute<T>;

 public:
  GradAct(C* g, int64_t ldg, const T* grad, int64_t gs_a, int64_t gs_b, const C* bias, ActGrad act_grad)
      : g_(g), ldg_(ldg), grad_(grad), gs_a_(gs_a), gs_b_(gs_b), bias_(bias), act_grad_(act_grad) {}

  void Row(int64_t a, int64_t b0, const C* vals, int64_t count) const override {
    const hn::ScalableTag<C> d;
    const int64_t L = static_cast<int64_t>(hn::Lanes(d));
    for (int64_t i = 0; i < count; i += L) {
      const auto z = hn::Add(hn::LoadU(d, vals + i), hn::LoadU(d, bias_ + b0 + i));
      const auto g = LoadN(d, grad_ + a * gs_a_ + (b0 + i) * gs_b_, gs_b_, count - i);
      StoreN(d, act_grad_(d, g, z), g_ + a * ldg_ + b0 + i, 1, count - i);
    }
  }

 private:
  C* g_;
  int64_t ldg_;
  const T* grad_;
  int64_t gs_a_, gs_b_;
  const C* bias_;
  ActGrad act_grad_;
};

}  // namespace opforge::gemm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // OPFORGE_OPS_LINEAR_ACT_EPILOGUE_INL_H_
