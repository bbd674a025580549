// linear_act on CUDA: the tiled product of gemm.cuh with bias and activation in its epilogue.
#include "opforge/registry.h"
#include "ops/linear_act/gemm.cuh"

namespace opforge::linear_act_cuda {

void run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("weight");
  const TensorView* bias = call.optional_tensor("bias");
  const TensorView& out = call.output();
  const int64_t k = x.size(-1), n = w.size(0), m = out.numel() / n;
  const std::vector<int64_t> lead(x.shape.begin(), x.shape.end() - 1);
  const std::vector<int64_t> lead_strides(x.strides.begin(), x.strides.end() - 1);
  cuda::visit_float(x.dtype, "linear_act", [&](auto tag) {
    using T = decltype(tag);
    const Mat<T> a{x.data_as<const T>(), cuda::make_indexer("linear_act", lead, lead_strides),
                   cuda::make_indexer("linear_act", {k}, {x.stride(-1)})};
    const Mat<T> b = matrix("linear_act", w.data_as<const T>(), n, w.stride(0), k, w.stride(1));
    visit_act(call.attr_str("act"), [&](auto act, auto) {
      const BiasAct<T, decltype(act)> epi{out.data_as<T>(), n, bias ? bias->data_as<const T>() : nullptr,
                                          bias ? bias->stride(0) : 0, act};
      gemm<cuda::Acc<T>>("linear_act", m, n, k, a, b, epi, cuda::stream_of(call));
    });
  });
}

OPFORGE_KERNEL(linear_act, "cuda", float_dtypes(), run);

}  // namespace opforge::linear_act_cuda
