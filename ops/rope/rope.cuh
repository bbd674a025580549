// The rotation rope and rope_backward share on CUDA: a few pairs per thread, any strides.
#pragma once

#include <cstdint>

#include "opforge/cuda/common.cuh"

namespace opforge::rope_cuda {

// I: the index type of the pair arithmetic (int32_t when every index fits: 64-bit divisions are
// long instruction sequences on the GPU and were a large part of this memory-bound kernel's time).
// Each thread takes kPairsPerThread pairs a grid stride apart, loading all before storing any, so
// that more loads are in flight (what HBM needs to run at full speed).
constexpr int kPairsPerThread = 4;

template <typename T, typename I>
__global__ void rotate_kernel(T* out, const T* x, cuda::Indexer rows, int64_t step, const T* cos, const T* sin,
                              int64_t cs0, int64_t cs1, int64_t ss0, int64_t ss1, I heads, I seq, I half,
                              bool interleaved, float sign, I pairs) {
  using A = cuda::Acc<T>;
  const I stride = static_cast<I>(gridDim.x * blockDim.x);
  for (I first = static_cast<I>(blockIdx.x * blockDim.x + threadIdx.x); first < pairs;
       first += stride * kPairsPerThread) {
    A a[kPairsPerThread], b[kPairsPerThread], c[kPairsPerThread], s[kPairsPerThread];
    I r[kPairsPerThread], ia[kPairsPerThread], ib[kPairsPerThread];
#pragma unroll
    for (int u = 0; u < kPairsPerThread; ++u) {
      const I e = first + static_cast<I>(u) * stride;
      if (e >= pairs) break;
      r[u] = e / half;
      const I i = e - r[u] * half, p = (r[u] / heads) % seq;
      ia[u] = interleaved ? 2 * i : i;
      ib[u] = interleaved ? 2 * i + 1 : i + half;
      const T* row = x + rows.offset(r[u]);
      a[u] = cuda::load(row + ia[u] * step);
      b[u] = cuda::load(row + ib[u] * step);
      c[u] = cuda::load(cos + p * cs0 + i * cs1);
      s[u] = A(sign) * cuda::load(sin + p * ss0 + i * ss1);
    }
#pragma unroll
    for (int u = 0; u < kPairsPerThread; ++u) {
      const I e = first + static_cast<I>(u) * stride;
      if (e >= pairs) break;
      T* o = out + int64_t(r[u]) * 2 * half;
      cuda::store(o + ia[u], a[u] * c[u] - b[u] * s[u]);
      cuda::store(o + ib[u], a[u] * s[u] + b[u] * c[u]);
    }
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
      const unsigned blocks = cuda::blocks_for((pairs + kPairsPerThread - 1) / kPairsPerThread, threads);
      const auto launch = [&](auto index) {
        using I = decltype(index);
        // the pair index plus one grid stride per unrolled step stays below I's limit
        rotate_kernel<T, I><<<blocks, threads, 0, cuda::stream_of(call)>>>(
            out.data_as<T>(), x.data_as<const T>(), rows, x.stride(-1), cos.data_as<const T>(),
            sin.data_as<const T>(), cos.strides[0], cos.strides[1], sin.strides[0], sin.strides[1],
            static_cast<I>(x.size(-2)), static_cast<I>(x.size(-3)), static_cast<I>(half), call.attr_bool("interleaved"),
            inverse ? -1.0f : 1.0f, static_cast<I>(pairs));
      };
      const int64_t reach = pairs + int64_t(blocks) * threads * kPairsPerThread;
      if (reach < INT32_MAX) launch(int32_t{});
      else launch(int64_t{});
    }
  });
  cuda::check_launch(op);
}

}  // namespace opforge::rope_cuda
