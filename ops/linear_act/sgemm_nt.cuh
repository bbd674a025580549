// linear_act's float32 product on the common layout: D[a, b] = sum_p A[a, p] B[b, p] with both
// operands row-major in p (x's rows, the weight's rows), p-contiguous, rows 16-byte aligned.
// A 128 x 128 tile per block of 256 threads, 8 x 8 results per thread (two 4 x 4 quadrants 64
// apart, so the shared-memory reads are float4s without bank conflicts), K in steps of 8 through
// two shared buffers: the next step's float4 loads are in flight while this step computes.
// gemm.cuh's 64 x 64 kernel, 4 x 4 per thread with scalar loads, reached 11.8 TFLOP/s on the
// H200 against torch.mm's 51.3 (float32, 16384 x 4096 x 4096); this is the classic layout that
// closes most of that gap without tensor cores (which would change float32's precision).
#pragma once

#include <cstdint>

#include "opforge/cuda/common.cuh"

namespace opforge::linear_act_cuda {

constexpr int kBig = 128, kBigStep = 8, kBigThreads = 256;

template <class Epi>
__global__ void __launch_bounds__(kBigThreads, 2)
    sgemm_nt_kernel(int64_t M, int64_t N, int64_t K, const float* __restrict__ A, int64_t lda,
                    const float* __restrict__ B, int64_t ldb, Epi epi) {
  __shared__ __align__(16) float as[2][kBigStep][kBig];
  __shared__ __align__(16) float bs[2][kBigStep][kBig];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t m0 = int64_t(blockIdx.y) * kBig, n0 = int64_t(blockIdx.x) * kBig;
  // Each thread loads one float4 of each operand per step: row tid / 2, columns (tid % 2) * 4 + 0..3.
  const int load_row = tid / 2, load_col = (tid % 2) * 4;
  const bool a_row = m0 + load_row < M, b_row = n0 + load_row < N;
  const float* a_src = A + (a_row ? (m0 + load_row) * lda : 0) + load_col;
  const float* b_src = B + (b_row ? (n0 + load_row) * ldb : 0) + load_col;

  // K is a multiple of 4 here, so a float4 at a multiple of 4 is wholly inside K or wholly past it.
  const auto fetch = [&](int64_t k0, float4& ra, float4& rb) {
    const bool in_k = k0 + load_col < K;
    ra = a_row && in_k ? *reinterpret_cast<const float4*>(a_src + k0) : make_float4(0.f, 0.f, 0.f, 0.f);
    rb = b_row && in_k ? *reinterpret_cast<const float4*>(b_src + k0) : make_float4(0.f, 0.f, 0.f, 0.f);
  };
  const auto put = [&](int buf, const float4& ra, const float4& rb) {
    as[buf][load_col + 0][load_row] = ra.x;
    as[buf][load_col + 1][load_row] = ra.y;
    as[buf][load_col + 2][load_row] = ra.z;
    as[buf][load_col + 3][load_row] = ra.w;
    bs[buf][load_col + 0][load_row] = rb.x;
    bs[buf][load_col + 1][load_row] = rb.y;
    bs[buf][load_col + 2][load_row] = rb.z;
    bs[buf][load_col + 3][load_row] = rb.w;
  };

  float acc[8][8] = {};
  float4 ra, rb;
  fetch(0, ra, rb);
  put(0, ra, rb);
  __syncthreads();
  int buf = 0;
  for (int64_t k0 = 0; k0 < K; k0 += kBigStep) {
    const bool more = k0 + kBigStep < K;
    if (more) fetch(k0 + kBigStep, ra, rb);
#pragma unroll
    for (int k = 0; k < kBigStep; ++k) {
      const float4 a_lo = *reinterpret_cast<const float4*>(&as[buf][k][ty * 4]);
      const float4 a_hi = *reinterpret_cast<const float4*>(&as[buf][k][ty * 4 + 64]);
      const float4 b_lo = *reinterpret_cast<const float4*>(&bs[buf][k][tx * 4]);
      const float4 b_hi = *reinterpret_cast<const float4*>(&bs[buf][k][tx * 4 + 64]);
      const float av[8] = {a_lo.x, a_lo.y, a_lo.z, a_lo.w, a_hi.x, a_hi.y, a_hi.z, a_hi.w};
      const float bv[8] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w, b_hi.x, b_hi.y, b_hi.z, b_hi.w};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    // The other buffer was last read in the previous step, which every thread has finished (the
    // barrier below it); this step's readers of `buf` are done at the barrier below.
    if (more) put(buf ^ 1, ra, rb);
    __syncthreads();
    buf ^= 1;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t r = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t c = n0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4);
      if (r < M && c < N) epi(r, c, acc[i][j]);
    }
  }
}

// Whether sgemm_nt_kernel takes this product: float32 rows of A (lda apart) and B (ldb apart),
// p-contiguous, 16-byte aligned at every row start, K a multiple of 4, and few enough row tiles
// for the grid's y dimension.
inline bool sgemm_nt_fits(const void* a, int64_t lda, const void* b, int64_t ldb, int64_t M, int64_t K) {
  return cuda::aligned16(a) && cuda::aligned16(b) && lda % 4 == 0 && ldb % 4 == 0 && K % 4 == 0 && K > 0 &&
         (M + kBig - 1) / kBig <= 65535;
}

template <class Epi>
void sgemm_nt(const char* op, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b,
              int64_t ldb, Epi epi, cudaStream_t stream) {
  const dim3 grid(unsigned((N + kBig - 1) / kBig), unsigned((M + kBig - 1) / kBig));
  sgemm_nt_kernel<<<grid, kBigThreads, 0, stream>>>(M, N, K, a, lda, b, ldb, epi);
  cuda::check_launch(op);
}

}  // namespace opforge::linear_act_cuda
