// NVIDIA's cuBLASLt for the matrix products of opforge's CUDA kernels (linear_act and its backward),
// loaded at run time: opforge does not link it, so a machine without it still runs every op on
// opforge's own kernels. The library is the one the process already has (torch and JAX's CUDA
// builds load it), else libcublasLt.so.<major> from the loader's path; OPFORGE_CUBLASLT=0 turns
// it off and OPFORGE_CUBLASLT=/path/to/libcublasLt.so.13 names the file.
#pragma once

#include <cstdint>
#include <string>

#include "opforge/dtype.h"

namespace opforge {
class ScratchAllocator;  // opforge/kernel.h
}  // namespace opforge

namespace opforge::cuda::blaslt {

// One operand of D[a, b] = sum_p A(a, p) B(b, p): element (r, p) at data[r * row_stride + p * col_stride].
struct Operand {
  const void* data;
  int64_t row_stride, col_stride;
};

// D = A B^T (+ bias[b]), D row-major [m, n] at `out` (contiguous), in `out_dtype`: `dtype` (the
// operands') or, for the half types, float32 (a product the caller rounds once in its own
// pass). A bias (dtype, packed, 16-byte aligned) only where out_dtype is dtype. On `stream` (a
// cudaStream_t) of the current device. Sums in float for float32 (no TF32: torch's default
// precision) and the half types, in double for float64. With accumulate, D = A B^T + D (D read
// in out_dtype, the sum rounded once). With scale, D = scale A B^T (+ bias, + D): the product
// alone scaled (a power of two is exact). cuBLASLt's workspace (up to workspace_bytes(), as much as
// the algorithm it picks asks for) comes from `scratch`, the call's framework allocator, or
// opforge's pool (opforge/cuda/scratch.h). Returns false, having launched nothing, when cuBLASLt is
// not loaded or turned off, when one operand is strided in both dimensions or its rows overlap,
// when cuBLASLt has no algorithm for the case, or when its workspace finds no room; the caller
// then runs its own kernel. A failure of a call cuBLASLt accepted raises opforge's runtime error
// naming `op`.
bool matmul(const char* op, DType dtype, int64_t m, int64_t n, int64_t k, Operand a, Operand b, const void* bias,
            void* out, DType out_dtype, void* stream, ScratchAllocator* scratch, bool accumulate = false,
            double scale = 1);

// The most workspace matmul offers cuBLASLt on a device of compute capability `major`.x: NVIDIA's
// recommendation, 32 MiB on Hopper and later, 4 MiB before (more algorithms, split-K among them;
// without any, the heuristic picks among fewer, and torch, which passes the same on Hopper, may
// run faster).
inline uint64_t workspace_bytes(int major) { return (major >= 9 ? uint64_t{32} : uint64_t{4}) << 20; }

// Whether matmul can run through cuBLASLt at all: turned on and the library loaded. For callers
// that would prepare operands only a cuBLASLt product uses (linear_act_backward's half-type parts).
bool ready();

// Calls matmul ran through cuBLASLt and calls it declined, since the process started (tests
// check that a case meant for cuBLASLt reached it).
struct Calls {
  int64_t taken, declined;
};
Calls calls();

// "cuBLASLt 13.1.0 (libcublasLt.so.13)" when matmul uses it, else why not.
std::string status();

// Turns cuBLASLt on or off for this process (opforge's own kernels when off); returns the
// previous setting. For tests and benchmarks that compare the two.
bool set_enabled(bool enabled);

}  // namespace opforge::cuda::blaslt
