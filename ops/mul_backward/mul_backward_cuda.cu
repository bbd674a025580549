// mul_backward on CUDA: each operand's gradient sums grad * other over the dimensions the
// operand was broadcast along (the other operand read through broadcast strides), in an order
// that depends on the shapes only (opforge/cuda/sum_to_shape.cuh), so results are bitwise
// repeatable.
#include "opforge/cuda/sum_to_shape.cuh"
#include "opforge/registry.h"

namespace opforge::mul_backward_cuda {

// The terms of one gradient: grad times the other operand, each split into the dimensions the
// result keeps and those it sums.
template <typename T>
struct ProductTerms {
  const T* grad;
  const T* other;
  cuda::Indexer g_kept, g_summed, o_kept, o_summed;
  struct At {
    const T* g;
    const T* b;
  };
  __device__ At at(int64_t o) const { return {grad + g_kept.offset(o), other + o_kept.offset(o)}; }
  __device__ cuda::Acc<T> operator()(const At& at, int64_t i) const {
    return cuda::load(at.g + g_summed.offset(i)) * cuda::load(at.b + o_summed.offset(i));
  }
};

// out = grad * other summed down to out's shape; other is broadcast to grad's shape.
void reduce(const KernelCall& call, const TensorView& grad, const TensorView& other, const TensorView& out) {
  const char* op = "mul_backward";
  if (out.numel() == 0) return;
  cudaStream_t stream = cuda::stream_of(call);
  if (grad.numel() == 0)  // a size-0 dimension summed away: the sum of nothing
    return cuda::check_cuda(op, cudaMemsetAsync(out.data, 0, out.nbytes(), stream), "cudaMemsetAsync");
  const cuda::SumSplit s =
      cuda::split_for_sum(grad.shape, out.shape, {grad.strides, broadcast_strides(other, grad.shape)});
  const int64_t m = out.numel(), r = grad.numel() / m;
  cuda::visit(grad.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      fail(ErrorKind::not_implemented, "mul_backward(): no integer kernel");
    } else {
      const ProductTerms<T> terms{grad.data_as<const T>(), other.data_as<const T>(),
                                  cuda::make_indexer(op, s.kept, s.kept_steps[0]),
                                  cuda::make_indexer(op, s.summed, s.summed_steps[0]),
                                  cuda::make_indexer(op, s.kept, s.kept_steps[1]),
                                  cuda::make_indexer(op, s.summed, s.summed_steps[1])};
      cuda::sum_to_shape(call, out.data_as<T>(), terms, m, r, s.inner_kept);
    }
  });
}

void run(const KernelCall& call) {
  const TensorView& grad = call.tensor("grad");
  reduce(call, grad, call.tensor("y"), call.output(0));
  reduce(call, grad, call.tensor("x"), call.output(1));
}

OPFORGE_KERNEL(mul_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::mul_backward_cuda
