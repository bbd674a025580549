// A libcublasLt for the host CUDA emulator: the entry points src/backends/cublaslt.cu loads, doing
// what NVIDIA's documentation says they do, on host memory (the emulated device's). The emulated
// test loads it through OPFORGE_CUBLASLT=<this library>, so opforge's real loader and its mapping
// of row-major operands onto cuBLASLt's column-major layouts, transposes, bias epilogue and
// beta = 1 accumulation run and are compared with the CPU kernels; its algorithm asks for a
// workspace when offered one, which each call must then pass. Written from the documented
// contract, not from opforge's code: a mapping error shows as a wrong result or as an inconsistent
// call, which returns CUBLAS_STATUS_INTERNAL_ERROR (opforge then raises, naming the op).
//
//   D = alpha op(A) op(B) + beta C (+ bias[i] on row i with CUBLASLT_EPILOGUE_BIAS), column-major:
//   element (i, j) of a rows x cols layout at i + j * ld; op(X) = X or X^T (CUBLAS_OP_N / _T).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

namespace {

struct Layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct Desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
};

struct Pref {
  uint64_t max_workspace = 0;  // the documented default: no workspace
};

std::mutex mutex;
std::map<const void*, Layout> layouts;
std::map<const void*, Desc> descs;
std::map<const void*, Pref> prefs;

// An opaque object of the header's type, its state kept beside it.
template <class Opaque, class State>
cublasStatus_t create(Opaque** object, std::map<const void*, State>& table, State state) {
  *object = new Opaque{};
  std::lock_guard lock(mutex);
  table[*object] = state;
  return CUBLAS_STATUS_SUCCESS;
}
template <class Opaque, class State>
cublasStatus_t destroy(Opaque* object, std::map<const void*, State>& table) {
  std::lock_guard lock(mutex);
  table.erase(object);
  delete object;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t inconsistent(const char* what) {
  std::fprintf(stderr, "cublaslt mock: inconsistent call: %s\n", what);
  return CUBLAS_STATUS_INTERNAL_ERROR;
}

double read(const void* p, cudaDataType_t type, int64_t i) {
  switch (type) {
    case CUDA_R_32F: return static_cast<const float*>(p)[i];
    case CUDA_R_64F: return static_cast<const double*>(p)[i];
    case CUDA_R_16F: return __half2float(static_cast<const __half*>(p)[i]);
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return 0;
  }
}

void write(void* p, cudaDataType_t type, int64_t i, double v) {
  switch (type) {
    case CUDA_R_32F: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case CUDA_R_64F: static_cast<double*>(p)[i] = v; break;
    case CUDA_R_16F: static_cast<__half*>(p)[i] = __float2half(static_cast<float>(v)); break;
    case CUDA_R_16BF: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(static_cast<float>(v)); break;
    default: break;
  }
}

// op(X)(i, j) of a stored layout.
double element(const void* p, const Layout& l, cublasOperation_t op, uint64_t i, uint64_t j) {
  return op == CUBLAS_OP_N ? read(p, l.type, int64_t(i) + int64_t(j) * l.ld) : read(p, l.type, int64_t(j) + int64_t(i) * l.ld);
}

// Sums in the compute type: float for COMPUTE_32F (each product and partial sum rounded to float),
// double for COMPUTE_64F.
template <typename A>
void multiply(const Desc& d, const void* alpha, const void* a, const Layout& la, const void* b, const Layout& lb,
              const void* beta, const void* c, const Layout& lc, void* out, const Layout& ld, uint64_t k) {
  const A al = *static_cast<const A*>(alpha), be = *static_cast<const A*>(beta);
  for (uint64_t i = 0; i < ld.rows; ++i)
    for (uint64_t j = 0; j < ld.cols; ++j) {
      A sum = 0;
      for (uint64_t p = 0; p < k; ++p)
        sum += A(element(a, la, d.trans_a, i, p)) * A(element(b, lb, d.trans_b, p, j));
      A v = al * sum;
      if (be != A(0)) v += be * A(read(c, lc.type, int64_t(i) + int64_t(j) * lc.ld));
      if (d.epilogue == CUBLASLT_EPILOGUE_BIAS) v += A(read(d.bias, ld.type, int64_t(i)));
      write(out, ld.type, int64_t(i) + int64_t(j) * ld.ld, double(v));
    }
}

}  // namespace

extern "C" {

size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  static int dummy;
  *handle = reinterpret_cast<cublasLtHandle_t>(&dummy);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  return create(desc, descs, Desc{compute, scale});
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) { return destroy(desc, descs); }
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  std::lock_guard lock(mutex);
  Desc& d = descs.at(desc);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      if (size != sizeof(d.trans_a)) return inconsistent("TRANSA size");
      d.trans_a = *static_cast<const cublasOperation_t*>(buf);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_TRANSB:
      if (size != sizeof(d.trans_b)) return inconsistent("TRANSB size");
      d.trans_b = *static_cast<const cublasOperation_t*>(buf);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      if (size != sizeof(d.epilogue)) return inconsistent("EPILOGUE size");
      d.epilogue = *static_cast<const cublasLtEpilogue_t*>(buf);
      return d.epilogue == CUBLASLT_EPILOGUE_DEFAULT || d.epilogue == CUBLASLT_EPILOGUE_BIAS ? CUBLAS_STATUS_SUCCESS
                                                                                              : CUBLAS_STATUS_NOT_SUPPORTED;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      if (size != sizeof(d.bias)) return inconsistent("BIAS_POINTER size");
      d.bias = *static_cast<const void* const*>(buf);
      return CUBLAS_STATUS_SUCCESS;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (ld < int64_t(rows) && cols > 1) return inconsistent("leading dimension below the row count");
  return create(layout, layouts, Layout{type, rows, cols, ld});
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) { return destroy(layout, layouts); }

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  return create(pref, prefs, Pref{});
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) { return destroy(pref, prefs); }
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  if (attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) return CUBLAS_STATUS_SUCCESS;
  if (size != sizeof(uint64_t)) return inconsistent("MAX_WORKSPACE_BYTES size");
  std::lock_guard lock(mutex);
  prefs.at(pref).max_workspace = *static_cast<const uint64_t*>(buf);
  return CUBLAS_STATUS_SUCCESS;
}

// The mock's algorithm takes kWantedWorkspace bytes of workspace when the preference offers that
// much (as cuBLASLt's split-K algorithms do), else none; the algorithm remembers which.
constexpr uint64_t kWantedWorkspace = 64 << 10;

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* count) {
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  uint64_t offered = 0;
  {
    std::lock_guard lock(mutex);
    offered = prefs.at(pref).max_workspace;
  }
  results[0] = {};
  results[0].workspaceSize = offered >= kWantedWorkspace ? kWantedWorkspace : 0;
  results[0].algo.data[0] = results[0].workspaceSize;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha, const void* a,
                              cublasLtMatrixLayout_t a_desc, const void* b, cublasLtMatrixLayout_t b_desc,
                              const void* beta, const void* c, cublasLtMatrixLayout_t c_desc, void* d,
                              cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t) {
  Desc dd;
  Layout la, lb, lc, ld;
  {
    std::lock_guard lock(mutex);
    dd = descs.at(desc);
    la = layouts.at(a_desc), lb = layouts.at(b_desc), lc = layouts.at(c_desc), ld = layouts.at(d_desc);
  }
  // op(A) is m x k, op(B) k x n, C and D m x n.
  const uint64_t m = dd.trans_a == CUBLAS_OP_N ? la.rows : la.cols, k = dd.trans_a == CUBLAS_OP_N ? la.cols : la.rows;
  const uint64_t kb = dd.trans_b == CUBLAS_OP_N ? lb.rows : lb.cols, n = dd.trans_b == CUBLAS_OP_N ? lb.cols : lb.rows;
  if (k != kb) return inconsistent("op(A) and op(B) disagree on k");
  if (ld.rows != m || ld.cols != n || lc.rows != m || lc.cols != n) return inconsistent("D's shape is not op(A) op(B)'s");
  if (la.type != lb.type) return inconsistent("A and B of different types");
  if (dd.epilogue == CUBLASLT_EPILOGUE_BIAS && !dd.bias) return inconsistent("bias epilogue without a bias");
  // The workspace the algorithm asked for, at least: every byte of it written (memory that is not
  // the device's, or is smaller than said, faults here or at its release).
  const uint64_t wanted = algo ? algo->data[0] : 0;
  if (wanted && (!workspace || workspace_bytes < wanted)) return inconsistent("less workspace than the algorithm's");
  if (wanted) std::memset(workspace, 0x5a, workspace_bytes);
  const bool wide = dd.compute == CUBLAS_COMPUTE_64F;
  if (wide != (dd.scale == CUDA_R_64F) || wide != (la.type == CUDA_R_64F)) return inconsistent("compute and scale types");
  if (wide)
    multiply<double>(dd, alpha, a, la, b, lb, beta, c, lc, d, ld, k);
  else
    multiply<float>(dd, alpha, a, la, b, lb, beta, c, lc, d, ld, k);
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
