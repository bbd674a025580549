// add_backward on CUDA: each operand's gradient sums grad over the dimensions the operand was
// broadcast along, in an order that depends on the shapes only (opforge/cuda/sum_to_shape.cuh),
// so results are bitwise repeatable.
#include "opforge/cuda/sum_to_shape.cuh"
#include "opforge/registry.h"

namespace opforge::add_backward_cuda {

void reduce(const KernelCall& call, const TensorView& grad, const TensorView& out) {
  if (out.numel() == 0) return;
  cudaStream_t stream = cuda::stream_of(call);
  if (grad.numel() == 0)  // a size-0 dimension summed away: the sum of nothing
    return cuda::check_cuda("add_backward", cudaMemsetAsync(out.data, 0, out.nbytes(), stream), "cudaMemsetAsync");
  const cuda::SumSplit s = cuda::split_for_sum(grad.shape, out.shape, {grad.strides});
  const int64_t m = out.numel(), r = grad.numel() / m;
  cuda::visit(grad.dtype, "add_backward", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      fail(ErrorKind::not_implemented, "add_backward(): no integer kernel");
    } else {
      const cuda::GradTerms<T> terms{grad.data_as<const T>(),
                                     cuda::make_indexer("add_backward", s.kept, s.kept_steps[0]),
                                     cuda::make_indexer("add_backward", s.summed, s.summed_steps[0])};
      cuda::sum_to_shape(call, out.data_as<T>(), terms, m, r, s.inner_kept);
    }
  });
}

void run(const KernelCall& call) {
  const TensorView& grad = call.tensor("grad");
  reduce(call, grad, call.output(0));
  reduce(call, grad, call.output(1));
}

OPFORGE_KERNEL(add_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::add_backward_cuda
