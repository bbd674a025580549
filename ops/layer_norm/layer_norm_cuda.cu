// layer_norm on CUDA: the kernels of layer_norm.cuh, cached rows where the layout allows, panels
// of rows where they sit side by side.
#include "ops/layer_norm/layer_norm.cuh"
#include "opforge/registry.h"

namespace opforge::layer_norm_cuda {

void run(const KernelCall& call) {
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("weight");
  const TensorView* b = call.optional_tensor("bias");
  const TensorView& out = call.output();
  const int64_t n = x.size(-1);
  if (n == 0) return;
  const int64_t rows = x.numel() / n;
  Dims outer(x.shape.begin(), x.shape.end() - 1);
  Dims outer_strides(x.strides.begin(), x.strides.end() - 1);
  const auto rows_ix = cuda::make_indexer("layer_norm", outer, outer_strides);
  cuda::visit(x.dtype, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      fail(ErrorKind::not_implemented, "layer_norm(): no integer kernel");
    } else {
      const cudaStream_t stream = cuda::stream_of(call);
      const T* bias = b ? b->data_as<const T>() : nullptr;
      const int64_t b_step = b ? b->stride(0) : 0;
      const double eps = call.attr_float("eps");
      if (const int threads = cuda::contiguous_row_threads<OwnRow<T>>(x, out, {&w, b})) {
        contiguous_kernel<T><<<cuda::row_blocks(rows), threads, 0, stream>>>(
            out.data_as<T>(), x.data_as<const T>(), w.data_as<const T>(), w.stride(0), bias, b_step, rows, n, eps);
      } else if (const cuda::Panels panels = cuda::side_by_side_panels<T>(x); panels.count) {
        panel_kernel<T><<<cuda::row_blocks(panels.count), cuda::PanelRow<T>::kThreads, 0, stream>>>(
            out.data_as<T>(), x.data_as<const T>(), rows_ix, x.stride(-1), panels, w.data_as<const T>(), w.stride(0),
            bias, b_step, n, eps);
      } else {
        strided_kernel<T><<<cuda::row_blocks(rows), kThreads, 0, stream>>>(
            out.data_as<T>(), x.data_as<const T>(), rows_ix, x.stride(-1), w.data_as<const T>(), w.stride(0), bias,
            b_step, rows, n, eps);
      }
    }
  });
  cuda::check_launch("layer_norm");
}

OPFORGE_KERNEL(layer_norm, "cuda", float_dtypes(), run);

}  // namespace opforge::layer_norm_cuda
