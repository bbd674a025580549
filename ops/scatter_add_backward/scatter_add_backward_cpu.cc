// scatter_add_backward on the CPU: a gather of whole slices, so a copy of bytes: each task
// copies one slice grad[o, index[i], :] to out[o, i, :]. No arithmetic, hence no Highway
// targets: memcpy is already the fastest copy on every CPU.
#include <algorithm>
#include <cstring>
#include <vector>

#include "opforge/cpu/visit.h"
#include "opforge/registry.h"
#include "ops/scatter_add/scatter_layout.h"

namespace opforge::scatter_add_backward_cpu {

void run(const KernelCall& call) {
  const TensorView& grad = call.tensor("grad");
  const TensorView& out = call.output();
  const int64_t dim = scatter::checked_dim(call, "grad");
  const scatter::IndexView index = scatter::checked_index(call, grad.shape[dim], "grad.shape[dim]");
  if (out.numel() == 0) return;  // called for the check alone (OpDef::validates)
  cpu::visit_float(grad.dtype, "scatter_add_backward", [&](auto tag) {
    using T = decltype(tag);
    scatter::Slices s = scatter::slices_of(grad, dim);
    const T* data = grad.data_as<const T>();
    std::vector<T> copy;
    if (!s.inner_contiguous) {
      copy = scatter::contiguous_copy<T>(grad);
      TensorView view = grad;
      view.data = copy.data();
      view.strides = contiguous_strides(grad.shape);
      s = scatter::slices_of(view, dim);
      data = copy.data();
    }
    T* dst = out.data_as<T>();
    const int64_t n = call.tensor("index").shape[0], inner = s.inner;
    parallel_for(s.outer * n, std::max<int64_t>(1, (1 << 15) / inner), [&](int64_t begin, int64_t end) {
      int64_t o = begin / n, i = begin % n, base = s.base(o);
      for (int64_t t = begin; t < end; ++t) {
        const T* from = data + base + index[i] * s.step;
        if (inner == 1) dst[t] = *from;
        else std::memcpy(dst + t * inner, from, sizeof(T) * inner);
        if (++i == n && t + 1 < end) {
          i = 0;
          base = s.base(++o);
        }
      }
    });
  });
}

OPFORGE_KERNEL(scatter_add_backward, "cpu", float_dtypes(), run);

}  // namespace opforge::scatter_add_backward_cpu
