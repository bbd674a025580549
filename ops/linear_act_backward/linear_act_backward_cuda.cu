// linear_act_backward on CUDA: g = grad * act'(z) into a float workspace, then the tiled product
// of ops/linear_act/gemm.cuh twice: grad_x = g @ weight and grad_weight = g^T @ x (cuBLASLt's
// products instead for float32 and float64, where it loads and takes the layout). z is preact
// (saved by linear_act_with_preact: g is one elementwise kernel) or, without it, recomputed by a
// third product whose epilogue stores g; act='none' needs no z. grad_bias sums g's columns in an
// order fixed by the shapes (deterministic).
#include <type_traits>

#include "opforge/cuda/blaslt.h"
#include "opforge/cuda/sum_to_shape.cuh"
#include "opforge/registry.h"
#include "ops/linear_act/gemm.cuh"

namespace opforge::linear_act_backward_cuda {
using namespace linear_act_cuda;

template <typename T, class ActGrad>
struct GradAct {
  cuda::Acc<T>* g;
  int64_t n;
  const T* grad;
  cuda::Indexer grad_rows;
  int64_t grad_stride;
  const T* bias;
  int64_t bias_stride;
  ActGrad act_grad;
  __device__ void operator()(int64_t a, int64_t b, cuda::Acc<T> z) const {
    if (bias) z += cuda::load(bias + b * bias_stride);
    g[a * n + b] = act_grad(cuda::load(grad + grad_rows.offset(a) + b * grad_stride), z);
  }
};

// g[a, b] = grad[a, b] * act'(preact[a, b]); rows through each operand's Indexer.
template <typename T, class ActGrad>
__global__ void grad_from_preact(cuda::Acc<T>* g, int64_t m, int64_t n, const T* grad, cuda::Indexer grad_rows,
                                 int64_t grad_stride, const T* preact, cuda::Indexer preact_rows,
                                 int64_t preact_stride, ActGrad act_grad) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < m * n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t a = e / n, b = e % n;
    g[e] = act_grad(cuda::load(grad + grad_rows.offset(a) + b * grad_stride),
                    cuda::load(preact + preact_rows.offset(a) + b * preact_stride));
  }
}

void run(const KernelCall& call) {
  const char* op = "linear_act_backward";
  const TensorView& grad = call.tensor("grad");
  const TensorView& x = call.tensor("x");
  const TensorView& w = call.tensor("weight");
  const TensorView* bias = call.optional_tensor("bias");
  const TensorView* preact = call.optional_tensor("preact");
  const int64_t k = x.size(-1), n = w.size(0), m = grad.numel() / (n ? n : 1);
  cudaStream_t stream = cuda::stream_of(call);
  const std::vector<int64_t> lead(x.shape.begin(), x.shape.end() - 1);
  const cuda::Indexer x_rows = cuda::make_indexer(op, lead, {x.strides.begin(), x.strides.end() - 1});
  const cuda::Indexer g_rows = cuda::make_indexer(op, lead, {grad.strides.begin(), grad.strides.end() - 1});
  for (int i = 0; i < 3; ++i) {  // empty sums (no rows, or n == 0) are zeros
    const TensorView& out = call.output(i);
    if (out.nbytes()) cuda::check_cuda(op, cudaMemsetAsync(out.data, 0, out.nbytes(), stream), "cudaMemsetAsync");
  }
  if (m == 0 || n == 0) return;
  cuda::visit_float(x.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    using A = cuda::Acc<T>;
    A* g = nullptr;
    cuda::check_cuda(op, cudaMallocAsync(reinterpret_cast<void**>(&g), sizeof(A) * m * n, stream), "cudaMallocAsync");
    try {
      const cuda::Indexer x_cols = cuda::make_indexer(op, {k}, {x.stride(-1)});
      const Mat<T> xa{x.data_as<const T>(), x_rows, x_cols};
      // cuBLASLt where g (in the accumulation type) has x's dtype, and x's rows are one stride
      // apart (its leading dims merge); it may still decline a layout (then the tiled kernels).
      const bool by_blaslt = std::is_same_v<A, T> && x_rows.rank <= 1;
      const int64_t x_row_stride = x_rows.rank == 1 ? x_rows.strides[0] : k;
      const bool bias_packed = bias && (bias->stride(0) == 1 || n == 1);
      visit_act(call.attr_str("act"), [&](auto, auto act_grad) {
        // act='none' needs no z (g = grad; IdentityGrad ignores the grad passed as z).
        constexpr bool identity = std::is_same_v<decltype(act_grad), IdentityGrad>;
        if (preact || identity) {
          const TensorView& z = identity ? grad : *preact;
          const cuda::Indexer z_rows = cuda::make_indexer(op, lead, {z.strides.begin(), z.strides.end() - 1});
          grad_from_preact<T><<<cuda::blocks_for(m * n, 256), 256, 0, stream>>>(
              g, m, n, grad.data_as<const T>(), g_rows, grad.stride(-1), z.data_as<const T>(), z_rows, z.stride(-1),
              act_grad);
          return cuda::check_launch(op);
        }
        // z = x @ weight^T + bias into g by cuBLASLt (float32, float64: g has x's dtype), then
        // g = grad * act'(z) in place; else one product whose epilogue forms g.
        if (by_blaslt && (!bias || bias_packed) &&
            cuda::blaslt::matmul(op, x.dtype, m, n, k, {x.data, x_row_stride, x.stride(-1)},
                                 {w.data, w.stride(0), w.stride(1)}, bias ? bias->data : nullptr, false, g, x.dtype,
                                 stream)) {
          grad_from_preact<T><<<cuda::blocks_for(m * n, 256), 256, 0, stream>>>(
              g, m, n, grad.data_as<const T>(), g_rows, grad.stride(-1), reinterpret_cast<const T*>(g),
              cuda::make_indexer(op, {m}, {n}), 1, act_grad);
          return cuda::check_launch(op);
        }
        const GradAct<T, decltype(act_grad)> epi{g, n, grad.data_as<const T>(), g_rows, grad.stride(-1),
                                                 bias ? bias->data_as<const T>() : nullptr, bias ? bias->stride(0) : 0,
                                                 act_grad};
        gemm<A>(op, m, n, k, xa, matrix(op, w.data_as<const T>(), n, w.stride(0), k, w.stride(1)), epi, stream);
      });
      // Only the results asked for (output_mask; the others are empty, k == 0 makes both empty).
      // grad_x[a, b] = sum_p g[a, p] weight[p, b]; grad_weight[a, b] = sum_p g[p, a] x[p, b].
      if (call.output(0).numel() &&
          !(by_blaslt && cuda::blaslt::matmul(op, x.dtype, m, k, n, {g, n, 1}, {w.data, w.stride(1), w.stride(0)},
                                              nullptr, false, call.output(0).data, x.dtype, stream))) {
        const BiasAct<T, Identity> gx{call.output(0).data_as<T>(), k, nullptr, 0, Identity{}};
        const Mat<T> w_t = matrix(op, w.data_as<const T>(), k, w.stride(1), n, w.stride(0));
        gemm<A>(op, m, k, n, matrix<A>(op, g, m, n, n, 1), w_t, gx, stream);
      }
      if (call.output(1).numel() &&
          !(by_blaslt && cuda::blaslt::matmul(op, x.dtype, n, k, m, {g, 1, n}, {x.data, x.stride(-1), x_row_stride},
                                              nullptr, false, call.output(1).data, x.dtype, stream))) {
        const BiasAct<T, Identity> gw{call.output(1).data_as<T>(), k, nullptr, 0, Identity{}};
        gemm<A>(op, n, k, m, matrix<A>(op, g, n, 1, m, n), Mat<T>{x.data_as<const T>(), x_cols, x_rows}, gw, stream);
      }
      // grad_bias: g's columns summed (opforge/cuda/sum_to_shape.cuh: chunks of rows, then in order).
      if (call.output(2).numel()) {
        const cuda::GradTerms<A> columns{g, cuda::make_indexer(op, {n}, {1}), cuda::make_indexer(op, {m}, {n})};
        cuda::sum_to_shape(op, call.output(2).data_as<T>(), columns, n, m, /*inner_kept=*/true, stream);
      }
    } catch (...) {  // a failed launch (gemm checks each of its own) must not leak the workspace
      cudaFreeAsync(g, stream);
      throw;
    }
    cuda::check_cuda(op, cudaFreeAsync(g, stream), "cudaFreeAsync");
  });
}

OPFORGE_KERNEL(linear_act_backward, "cuda", float_dtypes(), run);

}  // namespace opforge::linear_act_backward_cuda
