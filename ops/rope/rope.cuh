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

// The common layout (x and the tables contiguous, rows a whole number of 16-byte packs, aligned,
// fewer than 2^31 elements): each thread rotates kGroupsPerThread groups of Pack<T>::kSize pairs
// of a row with 16-byte loads and stores. The general kernel's 4-byte accesses reached 71% of the
// H100's copy bandwidth.
constexpr int kGroupsPerThread = 2;

template <typename T>
__global__ void __launch_bounds__(256)
    rotate_packed_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ cos,
                         const T* __restrict__ sin, uint32_t heads, uint32_t seq, uint32_t half_packs,
                         bool interleaved, float sign, uint32_t groups) {
  using A = cuda::Acc<T>;
  using P = cuda::Pack<T>;
  constexpr int V = P::kSize;
  const P* xp = reinterpret_cast<const P*>(x);
  P* op = reinterpret_cast<P*>(out);
  const uint32_t stride = gridDim.x * blockDim.x;
  for (uint32_t first = blockIdx.x * blockDim.x + threadIdx.x; first < groups; first += stride * kGroupsPerThread) {
    // Group g: pairs [ip * V, ip * V + V) of row r; the row's first half, then its second (rotate_half),
    // or its pairs side by side (interleaved): either way two packs of x.
    P lo[kGroupsPerThread], hi[kGroupsPerThread], c[kGroupsPerThread], s[kGroupsPerThread];
    uint32_t at_lo[kGroupsPerThread], at_hi[kGroupsPerThread];
#pragma unroll
    for (int u = 0; u < kGroupsPerThread; ++u) {
      const uint32_t g = first + u * stride;
      if (g >= groups) break;
      const uint32_t r = g / half_packs, ip = g - r * half_packs, table = (r / heads) % seq * half_packs + ip;
      const uint32_t row = r * 2 * half_packs;
      at_lo[u] = interleaved ? row + 2 * ip : row + ip;
      at_hi[u] = interleaved ? row + 2 * ip + 1 : row + half_packs + ip;
      lo[u] = xp[at_lo[u]];
      hi[u] = xp[at_hi[u]];
      c[u] = reinterpret_cast<const P*>(cos)[table];
      s[u] = reinterpret_cast<const P*>(sin)[table];
    }
#pragma unroll
    for (int u = 0; u < kGroupsPerThread; ++u) {
      const uint32_t g = first + u * stride;
      if (g >= groups) break;
      P rlo, rhi;
#pragma unroll
      for (int e = 0; e < V; ++e) {  // pair e of the group
        const A ce = static_cast<A>(c[u].v[e]), se = A(sign) * static_cast<A>(s[u].v[e]);
        if (interleaved) {  // pair e sits at 2e, 2e + 1 of the two packs' 2V values
          const P& from = 2 * e < V ? lo[u] : hi[u];
          P& to = 2 * e < V ? rlo : rhi;
          const int k = (2 * e) % V;
          const A a = static_cast<A>(from.v[k]), b = static_cast<A>(from.v[k + 1]);
          to.v[k] = static_cast<T>(a * ce - b * se);
          to.v[k + 1] = static_cast<T>(a * se + b * ce);
        } else {
          const A a = static_cast<A>(lo[u].v[e]), b = static_cast<A>(hi[u].v[e]);
          rlo.v[e] = static_cast<T>(a * ce - b * se);
          rhi.v[e] = static_cast<T>(a * se + b * ce);
        }
      }
      op[at_lo[u]] = rlo;
      op[at_hi[u]] = rhi;
    }
  }
}

// Whether rotate_packed_kernel takes this call (see above).
inline bool packable(const TensorView& x, const TensorView& cos, const TensorView& sin, const TensorView& out,
                     int64_t half, int pack) {
  auto table_ok = [&](const TensorView& t) {
    return cuda::aligned16(t.data) && t.strides[1] == 1 && (t.shape[0] == 1 || t.strides[0] == half);
  };
  return half % pack == 0 && x.numel() < INT32_MAX && x.is_contiguous() && out.is_contiguous() &&
         cuda::aligned16(x.data) && cuda::aligned16(out.data) && table_ok(cos) && table_ok(sin);
}

// out = x rotated by the tables' angles, or by their negatives when `inverse`.
inline void rotate(const KernelCall& call, const char* op, const TensorView& x, bool inverse) {
  const TensorView& cos = call.tensor("cos");
  const TensorView& sin = call.tensor("sin");
  const TensorView& out = call.output();
  Dims rows_shape(x.shape.begin(), x.shape.end() - 1);
  Dims rows_strides(x.strides.begin(), x.strides.end() - 1);
  const auto rows = cuda::make_indexer(op, rows_shape, rows_strides);
  const int64_t half = x.size(-1) / 2, pairs = x.numel() / 2;
  cuda::visit(x.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      fail(ErrorKind::not_implemented, op, "(): no integer kernel");
    } else {
      const int threads = 256;
      constexpr int V = cuda::Pack<T>::kSize;
      if (packable(x, cos, sin, out, half, V)) {
        const int64_t groups = pairs / V;
        if (groups > 0)
          rotate_packed_kernel<T><<<cuda::blocks_for((groups + kGroupsPerThread - 1) / kGroupsPerThread, threads),
                                    threads, 0, cuda::stream_of(call)>>>(
              out.data_as<T>(), x.data_as<const T>(), cos.data_as<const T>(), sin.data_as<const T>(),
              static_cast<uint32_t>(x.size(-2)), static_cast<uint32_t>(x.size(-3)), static_cast<uint32_t>(half / V),
              call.attr_bool("interleaved"), inverse ? -1.0f : 1.0f, static_cast<uint32_t>(groups));
        return;  // checked below
      }
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
