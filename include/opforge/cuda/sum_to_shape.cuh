// Deterministic sums over broadcast dimensions on CUDA, for the gradients of broadcasting ops
// (add_backward, mul_backward; linear_act_backward's bias): out[o] = sum over i < r of
// terms(o, i), where o runs over the dimensions the output keeps and i over those it sums.
// The order of every sum depends on (m, r) and the layout only, never on the GPU or the run:
// - short sums (r < 256): one thread per output, in order;
// - outputs along grad's inner dimension (neighbouring threads read neighbouring elements):
//   the sum range cut into chunks, one thread per (chunk, output) writing a float partial,
//   then one thread per output adding its partials in chunk order. Enough threads to fill
//   any GPU even for a bias gradient ([16384, 4096] -> [4096]: 4096 outputs of 16384 terms),
//   where one thread per output would leave most SMs idle behind a 16k-term serial sum;
// - otherwise (summing grad's inner dimension): one block per output, threads striding the
//   range, then a fixed shared-memory tree.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "opforge/cuda/common.cuh"
#include "opforge/cuda/scratch.h"

namespace opforge::cuda {

inline constexpr int kSumThreads = 256;
// Threads the chunked sum aims for (a fixed number, so results do not depend on the GPU), and
// the fewest terms a chunk sums.
inline constexpr int64_t kSumTargetThreads = int64_t(1) << 17, kSumMinChunk = 64;

// grad's dimensions split into those the output keeps (row-major over them) and those summed,
// with each operand's strides split alike. Size-1 dimensions are dropped.
struct SumSplit {
  Dims kept, summed;                        // sizes
  std::vector<Dims> kept_steps, summed_steps;  // per operand
  bool inner_kept = true;                                   // grad's innermost dimension is kept
};

// `out_shape` broadcasts to `grad_shape`; `strides` are each operand's strides over grad_shape.
inline SumSplit split_for_sum(const Dims& grad_shape, const Dims& out_shape,
                              const std::vector<Dims>& strides) {
  SumSplit s;
  s.kept_steps.resize(strides.size());
  s.summed_steps.resize(strides.size());
  const size_t lead = grad_shape.size() - out_shape.size();
  for (size_t d = 0; d < grad_shape.size(); ++d) {
    if (grad_shape[d] == 1) continue;
    s.inner_kept = d >= lead && out_shape[d - lead] == grad_shape[d];
    (s.inner_kept ? s.kept : s.summed).push_back(grad_shape[d]);
    auto& steps = s.inner_kept ? s.kept_steps : s.summed_steps;
    for (size_t k = 0; k < strides.size(); ++k) steps[k].push_back(strides[k][d]);
  }
  return s;
}

// The terms of a gradient that is grad itself summed (add_backward; a bias gradient).
template <typename S>
struct GradTerms {
  const S* grad;
  Indexer kept, summed;
  __device__ const S* at(int64_t o) const { return grad + kept.offset(o); }
  __device__ Acc<S> operator()(const S* base, int64_t i) const { return load(base + summed.offset(i)); }
};

template <class Terms, typename T>
__global__ void sum_per_thread(T* out, Terms terms, int64_t m, int64_t r) {
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < m; o += int64_t(gridDim.x) * blockDim.x) {
    const auto at = terms.at(o);
    Acc<T> sum = 0;
    for (int64_t i = 0; i < r; ++i) sum += terms(at, i);
    store(out + o, sum);
  }
}

// partial[c * m + o] = the sum of terms(o, i) for i in chunk c; o fastest across threads.
template <class Terms, typename A>
__global__ void sum_chunks(A* partial, Terms terms, int64_t m, int64_t r, int64_t chunks, int64_t chunk) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < m * chunks;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = e % m, c = e / m, end = (c + 1) * chunk < r ? (c + 1) * chunk : r;
    const auto at = terms.at(o);
    A sum = 0;
    for (int64_t i = c * chunk; i < end; ++i) sum += terms(at, i);
    partial[e] = sum;
  }
}

template <typename T, typename A>
__global__ void sum_partials(T* out, const A* partial, int64_t m, int64_t chunks) {
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < m; o += int64_t(gridDim.x) * blockDim.x) {
    A sum = 0;
    for (int64_t c = 0; c < chunks; ++c) sum += partial[c * m + o];
    store(out + o, sum);
  }
}

template <class Terms, typename T>
__global__ void sum_per_block(T* out, Terms terms, int64_t m, int64_t r) {
  using A = Acc<T>;
  __shared__ A partial[kSumThreads];
  for (int64_t o = blockIdx.x; o < m; o += gridDim.x) {
    const auto at = terms.at(o);
    A sum = 0;
    for (int64_t i = threadIdx.x; i < r; i += kSumThreads) sum += terms(at, i);
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int s = kSumThreads / 2; s > 0; s /= 2) {
      if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
      __syncthreads();
    }
    if (threadIdx.x == 0) store(out + o, partial[0]);
    __syncthreads();  // partial[0] is read above before the next output overwrites it
  }
}

// The number of chunks the chunked sum cuts r terms into for m outputs (1: one thread per output).
inline int64_t sum_chunk_count(int64_t m, int64_t r) {
  const int64_t by_threads = std::max<int64_t>(1, kSumTargetThreads / std::max<int64_t>(m, 1));
  return std::max<int64_t>(1, std::min(by_threads, r / kSumMinChunk));
}

// out[o] = sum of terms(o, i) for o < m, i < r, on `call`'s stream (m > 0). `inner_kept`: the
// output runs along grad's innermost dimension (see the top of this file).
template <typename T, class Terms>
void sum_to_shape(const KernelCall& call, T* out, const Terms& terms, int64_t m, int64_t r, bool inner_kept) {
  using A = Acc<T>;
  const char* op = call.op().name().c_str();
  const cudaStream_t stream = stream_of(call);
  const int64_t chunks = r < kSumThreads ? 1 : sum_chunk_count(m, r);
  if (r < kSumThreads || (inner_kept && chunks == 1)) {
    sum_per_thread<<<blocks_for(m, kSumThreads), kSumThreads, 0, stream>>>(out, terms, m, r);
  } else if (inner_kept) {
    const int64_t chunk = (r + chunks - 1) / chunks;
    const Scratch partial(call, sizeof(A) * m * chunks);
    sum_chunks<<<blocks_for(m * chunks, kSumThreads), kSumThreads, 0, stream>>>(partial.as<A>(), terms, m, r, chunks,
                                                                               chunk);
    check_launch(op);
    sum_partials<<<blocks_for(m, kSumThreads), kSumThreads, 0, stream>>>(out, static_cast<const A*>(partial.as<A>()),
                                                                         m, chunks);
  } else {
    sum_per_block<<<grid_blocks(m), kSumThreads, 0, stream>>>(out, terms, m, r);
  }
  check_launch(op);
}

}  // namespace opforge::cuda
