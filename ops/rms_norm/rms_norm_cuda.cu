// rms_norm on CUDA: the kernels of rms_norm.cuh, cached rows where the layout allows, panels of
// rows where they sit side by side.
#include "ops/rms_norm/rms_norm.cuh"
#include "opforge/registry.h"

namespace opforge::rms_norm_cuda {

void run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("weight");
  const TensorView& out = call.output();
  const int64_t n = x.size(-1);
  if (n == 0) return;
  const int64_t rows = x.numel() / n;
  Dims outer(x.shape.begin(), x.shape.end() - 1);
  Dims outer_strides(x.strides.begin(), x.strides.end() - 1);
  const auto rows_ix = cuda::make_indexer("rms_norm", outer, outer_strides);
  const double eps = call.attr_float("eps");
  cuda::visit(x.dtype, "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      fail(ErrorKind::not_implemented, "rms_norm(): no integer kernel");
    } else {
      const cudaStream_t stream = cuda::stream_of(call);
      if (const int threads = cuda::contiguous_row_threads<OwnRow<T>>(x, out, {&w})) {
        contiguous_kernel<T><<<cuda::row_blocks(rows), threads, 0, stream>>>(
            out.data_as<T>(), x.data_as<const T>(), w.data_as<const T>(), w.stride(0), rows, n, eps);
      } else if (const cuda::Panels panels = cuda::side_by_side_panels<T>(x); panels.count) {
        panel_kernel<T><<<cuda::row_blocks(panels.count), cuda::PanelRow<T>::kThreads, 0, stream>>>(
            out.data_as<T>(), x.data_as<const T>(), rows_ix, x.stride(-1), panels, w.data_as<const T>(), w.stride(0),
            n, eps);
      } else {
        strided_kernel<T><<<cuda::row_blocks(rows), kThreads, 0, stream>>>(
            out.data_as<T>(), x.data_as<const T>(), rows_ix, x.stride(-1), w.data_as<const T>(), w.stride(0), rows,
            n, eps);
      }
    }
  });
  cuda::check_launch("rms_norm");
}

OPFORGE_KERNEL(rms_norm, "cuda", float_dtypes(), run);

}  // namespace opforge::rms_norm_cuda
