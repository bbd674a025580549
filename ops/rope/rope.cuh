// The rotation rope and rope_backward share on CUDA: one thread per pair, any strides.
#pragma once

#include "opforge/cuda/common.cuh"

namespace opforge::rope_cuda {

template <typename T>
__global__ void rotate_kernel(T* out, const T* x, cuda::Indexer rows, int64_t step, const T* cos, const T* sin,
                              int64_t cs0, int64_t cs1, int64_t ss0, int64_t ss1, int64_t heads, int64_t seq,
                              int64_t half, bool interleaved, float sign, int64_t pairs) {
  using A = cuda::Acc<T>;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < pairs; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / half, i = e % half, p = (r / heads) % seq;
    const int64_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
    const T* row = x + rows.offset(r);
    const A a = cuda::load(row + ia * step), b = cuda::load(row + ib * step);
    const A c = cuda::load(cos + p * cs0 + i * cs1), s = A(sign) * cuda::load(sin + p * ss0 + i * ss1);
    cuda::store(out + r * 2 * half + ia, a * c - b * s);
    cuda::store(out + r * 2 * half + ib, a * s + b * c);
  }
}

// out = x rotated by the tables' angles, or by their negatives when `inverse`.
inline void rotate(const KernelCall& call, const char* op, const TensorView& x, bool inverse) {
  const TensorView& cos = call.tensor("cos");
  const TensorView& sin = call.tensor("sin");
  const TensorView& out = call.output();
  std::vector<int64_t> rows_shape(x.shape.begin(), x.shape.end() - 1);
  std::vector<int64_t> rows_strides(x.strides.begin(), x.strides.end() - 1);
  const auto rows = cuda::make_indexer(op, rows_shape, rows_strides);
  const int64_t half = x.size(-1) / 2, pairs = x.numel() / 2;
  cuda::visit(x.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      fail(ErrorKind::not_implemented, op, "(): no integer kernel");
    } else {
      const int threads = 256;
      rotate_kernel<T><<<cuda::blocks_for(pairs, threads), threads, 0, cuda::stream_of(call)>>>(
          out.data_as<T>(), x.data_as<const T>(), rows, x.stride(-1), cos.data_as<const T>(), sin.data_as<const T>(),
          cos.strides[0], cos.strides[1], sin.strides[0], sin.strides[1], x.size(-2), x.size(-3), half,
          call.attr_bool("interleaved"), inverse ? -1.0f : 1.0f, pairs);
    }
  });
  cuda::check_launch(op);
}

}  // namespace opforge::rope_cuda
