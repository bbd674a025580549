// opforge/cuda/blaslt.h: cuBLASLt through dlopen. The header gives the types and the function
// signatures (decltype); the library is found at run time, so libopforge.so has no link-time
// dependency on it and opforge's own kernels stay the fallback for every case cuBLASLt declines.
#include "opforge/cuda/blaslt.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "opforge/error.h"

#if OPFORGE_WITH_CUBLASLT
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include "opforge/cuda/scratch.h"
#endif

namespace opforge::cuda::blaslt {

namespace {
std::atomic<bool> enabled{true};
std::atomic<int64_t> taken{0}, declined{0};
}  // namespace

bool set_enabled(bool on) { return enabled.exchange(on); }
Calls calls() { return {taken.load(), declined.load()}; }

#if !OPFORGE_WITH_CUBLASLT

bool matmul(const char*, DType, int64_t, int64_t, int64_t, Operand, Operand, const void*, void*, DType, void*,
            ScratchAllocator*, bool, double) {
  return false;
}
std::string status() { return "not built in (cublasLt.h was not found when opforge was compiled)"; }
bool ready() { return false; }

#else

namespace {

// The entry points used, resolved from the library with the header's signatures.
struct Library {
  // Published (release) after the entry points and the version are set; never unloaded (torch
  // may share the library).
  std::atomic<void*> handle{nullptr};
  std::string name, reason;  // reason: why it is not used (meaningful while handle is null)
  bool retry = false;        // not in the process at first use: look again on later uses
  size_t version = 0;
#define OPFORGE_LT_FN(f) decltype(&::f) f = nullptr;
  OPFORGE_LT_FN(cublasLtGetVersion)
  OPFORGE_LT_FN(cublasLtCreate)
  OPFORGE_LT_FN(cublasLtMatmulDescCreate)
  OPFORGE_LT_FN(cublasLtMatmulDescDestroy)
  OPFORGE_LT_FN(cublasLtMatmulDescSetAttribute)
  OPFORGE_LT_FN(cublasLtMatrixLayoutCreate)
  OPFORGE_LT_FN(cublasLtMatrixLayoutDestroy)
  OPFORGE_LT_FN(cublasLtMatmulPreferenceCreate)
  OPFORGE_LT_FN(cublasLtMatmulPreferenceDestroy)
  OPFORGE_LT_FN(cublasLtMatmulPreferenceSetAttribute)
  OPFORGE_LT_FN(cublasLtMatmulAlgoGetHeuristic)
  OPFORGE_LT_FN(cublasLtMatmul)
#undef OPFORGE_LT_FN

  Library() {
    const char* env = std::getenv("OPFORGE_CUBLASLT");
    const std::string setting = env ? env : "";
    if (setting == "0" || setting == "off") {
      reason = "turned off by OPFORGE_CUBLASLT=" + setting;
      return;
    }
    void* h = nullptr;
    if (!setting.empty() && setting != "1") {
      name = setting;
      h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    } else {
      // The major version opforge was compiled against (the C API is stable within it): the
      // process's copy first (torch's, JAX's), else the loader's search.
      name = str("libcublasLt.so.", CUBLAS_VER_MAJOR);
      h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
      if (!h) h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      retry = h == nullptr;  // torch imported after opforge's first use still brings it
    }
    if (!h) {
      const char* why = dlerror();
      reason = str(name, " not loaded (", why ? why : "not found", ")");
      return;
    }
    reason = open(h);
  }

  // Resolves the entry points from h and publishes it; else closes it and says why.
  std::string open(void* h) {
    std::string missing;
    const auto resolve = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, symbol));
      if (!fn && missing.empty()) missing = symbol;
    };
    resolve(cublasLtGetVersion, "cublasLtGetVersion");
    resolve(cublasLtCreate, "cublasLtCreate");
    resolve(cublasLtMatmulDescCreate, "cublasLtMatmulDescCreate");
    resolve(cublasLtMatmulDescDestroy, "cublasLtMatmulDescDestroy");
    resolve(cublasLtMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
    resolve(cublasLtMatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
    resolve(cublasLtMatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
    resolve(cublasLtMatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
    resolve(cublasLtMatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
    resolve(cublasLtMatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
    resolve(cublasLtMatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
    resolve(cublasLtMatmul, "cublasLtMatmul");
    std::string why;
    if (!missing.empty()) {
      why = str(name, " lacks ", missing);
    } else {
      version = cublasLtGetVersion();  // major * 10000 + minor * 100 + patch
      if (version / 10000 != CUBLAS_VER_MAJOR)
        why = str(name, " is version ", version, ", opforge was built for major version ", CUBLAS_VER_MAJOR);
    }
    if (why.empty()) handle.store(h, std::memory_order_release);
    else dlclose(h);
    return why;
  }
};

// The library once loaded; until then, each use looks for a copy the process has loaded since
// (a cheap RTLD_NOLOAD lookup), so `import torch` after opforge's first use still counts.
const Library& library() {
  static Library lib;
  if (!lib.handle.load(std::memory_order_acquire) && lib.retry) {
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    if (!lib.handle.load(std::memory_order_acquire))
      if (void* h = dlopen(lib.name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) lib.open(h);
  }
  return lib;
}

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "a cuBLAS error";
  }
}

// A layout cuBLAS takes: a column-major stored matrix (rows x cols, leading dimension ld) and
// whether the product uses its transpose.
struct Stored {
  uint64_t rows, cols;
  int64_t ld;
  cublasOperation_t op;
};

// Operand (r, p) for r < count, p < k as cuBLAS's op(M) with shape k x count (`for_b`: our A,
// cuBLAS's B) or count x k (our B, cuBLAS's A). false when neither stride is 1 or rows overlap.
bool store(const Operand& x, int64_t count, int64_t k, bool for_b, Stored& s) {
  int64_t rs = x.row_stride, cs = x.col_stride;
  if (count == 1) rs = cs == 1 ? k : 1;  // a stride over one element is arbitrary: make it plain
  if (k == 1) cs = rs == 1 ? count : 1;
  if (cs == 1 && rs >= k) {  // each r a run of k: column-major k x count
    s = {uint64_t(k), uint64_t(count), rs, for_b ? CUBLAS_OP_N : CUBLAS_OP_T};
    return true;
  }
  if (rs == 1 && cs >= count) {  // each p a run of count: column-major count x k
    s = {uint64_t(count), uint64_t(k), cs, for_b ? CUBLAS_OP_T : CUBLAS_OP_N};
    return true;
  }
  return false;
}

uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t low = a & (~a + 1);  // the lowest set bit
  return low == 0 || low > 256 ? 256u : uint32_t(low);
}

// Everything cublasLtMatmulAlgoGetHeuristic's answer depends on.
using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, uint32_t, uint32_t,
                       uint32_t, uint32_t>;

// cuBLASLt's choice for a Key: whether it has one, the algorithm, and the workspace it needs.
struct Choice {
  bool usable;
  cublasLtMatmulAlgo_t algo;
  size_t workspace;
};

struct PerDevice {
  cublasLtHandle_t handle = nullptr;  // nullptr: cublasLtCreate failed
  uint64_t workspace = 0;             // the most workspace offered to the heuristic
};

struct Handles {
  std::mutex mutex;
  std::map<int, PerDevice> per_device;
  std::map<Key, Choice> algos;
  std::string create_failure;  // the last cublasLtCreate that failed, for status()
};

Handles& handles() {
  static Handles* h = new Handles;  // never destroyed: cuBLASLt may be gone at exit
  return *h;
}

template <typename T>
struct Owned {  // a cuBLASLt descriptor destroyed at scope exit
  using Destroy = cublasStatus_t (*)(T);
  explicit Owned(Destroy d) : destroy(d) {}
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  T value = nullptr;
  Destroy destroy;
  ~Owned() {
    if (value) destroy(value);
  }
};

}  // namespace

bool ready() { return enabled.load() && library().handle.load(std::memory_order_acquire) != nullptr; }

std::string status() {
  const Library& lib = library();
  if (!lib.handle.load(std::memory_order_acquire)) return lib.reason;
  const size_t v = lib.version;
  std::string s = str("cuBLASLt ", v / 10000, ".", v / 100 % 100, ".", v % 100, " (", lib.name, ")");
  {
    std::lock_guard<std::mutex> lock(handles().mutex);
    if (!handles().create_failure.empty()) s += ", but " + handles().create_failure;
  }
  return enabled.load() ? s : s + ", turned off";
}

namespace {

bool matmul_or_decline(const char* op, DType dtype, int64_t m, int64_t n, int64_t k, Operand a, Operand b,
                       const void* bias, void* out, DType out_dtype, void* stream, ScratchAllocator* scratch,
                       bool accumulate, double alpha) {
  if (m <= 0 || n <= 0 || k <= 0) return false;
  const Library& lib = library();
  if (!lib.handle.load(std::memory_order_acquire)) return false;
  cudaDataType_t type;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;  // never the TF32 or 16-bit compute types
  cudaDataType_t scale = CUDA_R_32F;
  switch (dtype) {
    case DType::float32: type = CUDA_R_32F; break;
    case DType::float16: type = CUDA_R_16F; break;
    case DType::bfloat16: type = CUDA_R_16BF; break;
    case DType::float64: type = CUDA_R_64F, compute = CUBLAS_COMPUTE_64F, scale = CUDA_R_64F; break;
    default: return false;
  }
  const bool half = dtype == DType::float16 || dtype == DType::bfloat16;
  if (out_dtype != dtype && !(half && out_dtype == DType::float32)) return false;
  // cuBLASLt reads the bias in D's type; failures on unaligned biases were reported for older
  // releases, and the callers' own pass adds any bias just as well.
  if (bias && (out_dtype != dtype || reinterpret_cast<uintptr_t>(bias) % 16)) return false;
  const cudaDataType_t out_type = out_dtype == dtype ? type : CUDA_R_32F;
  // Row-major D [m, n] is column-major D^T [n, m] = B A^T: cuBLAS's A is our B, its B our A^T.
  Stored sa, sb;
  if (!store(b, n, k, false, sa) || !store(a, m, k, true, sb)) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  // No relu epilogue: it is max(x, 0), which turns NaN into 0 where opforge's relu (and torch's)
  // keep it; the caller applies relu in its own pass.
  const cublasLtEpilogue_t epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  const uint32_t align_a = alignment(b.data), align_b = alignment(a.data), align_d = alignment(out);
  const uint32_t align_bias = bias ? alignment(bias) : 256u;
  const Key key{device, int(dtype) * 16 + int(out_dtype), m, n, k, sa.ld, sb.ld, int(sa.op), int(sb.op),
                int(epilogue), align_a, align_b, align_d, align_bias};

  const auto check = [&](cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS)
      fail(ErrorKind::runtime, op, "(): ", what, " failed: ", status_name(s), " (", int(s), ")");
  };
  Owned<cublasLtMatmulDesc_t> desc(lib.cublasLtMatmulDescDestroy);
  check(lib.cublasLtMatmulDescCreate(&desc.value, compute, scale), "cublasLtMatmulDescCreate");
  const auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* v, size_t size) {
    check(lib.cublasLtMatmulDescSetAttribute(desc.value, attr, v, size), "cublasLtMatmulDescSetAttribute");
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &sa.op, sizeof(sa.op));
  set(CUBLASLT_MATMUL_DESC_TRANSB, &sb.op, sizeof(sb.op));
  set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
  if (bias) set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
  const auto destroy_layout = lib.cublasLtMatrixLayoutDestroy;
  Owned<cublasLtMatrixLayout_t> la(destroy_layout), lb(destroy_layout), ld(destroy_layout);
  check(lib.cublasLtMatrixLayoutCreate(&la.value, type, sa.rows, sa.cols, sa.ld), "cublasLtMatrixLayoutCreate");
  check(lib.cublasLtMatrixLayoutCreate(&lb.value, type, sb.rows, sb.cols, sb.ld), "cublasLtMatrixLayoutCreate");
  check(lib.cublasLtMatrixLayoutCreate(&ld.value, out_type, uint64_t(n), uint64_t(m), n), "cublasLtMatrixLayoutCreate");

  cublasLtHandle_t handle = nullptr;
  Choice choice{};
  {
    Handles& h = handles();
    std::lock_guard<std::mutex> lock(h.mutex);
    auto [it, fresh] = h.per_device.emplace(device, PerDevice{});
    if (fresh) {
      const cublasStatus_t created = lib.cublasLtCreate(&it->second.handle);
      if (created != CUBLAS_STATUS_SUCCESS) {
        it->second.handle = nullptr;
        h.create_failure = str("cublasLtCreate failed on device ", device, " (", status_name(created), ")");
      }
      int major = 0;
      if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
        cudaGetLastError();  // 0: the smaller workspace
      it->second.workspace = workspace_bytes(major);
    }
    handle = it->second.handle;
    if (!handle) return false;
    auto found = h.algos.find(key);
    if (found == h.algos.end()) {
      Owned<cublasLtMatmulPreference_t> pref(lib.cublasLtMatmulPreferenceDestroy);
      check(lib.cublasLtMatmulPreferenceCreate(&pref.value), "cublasLtMatmulPreferenceCreate");
      // The workspace is the call's own (stream-ordered, from the framework or opforge's pool),
      // never one buffer shared between streams, so results do not depend on which stream ran.
      const uint64_t workspace = it->second.workspace;
      const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
      check(lib.cublasLtMatmulPreferenceSetAttribute(pref.value, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                     sizeof(workspace)),
            "cublasLtMatmulPreferenceSetAttribute");
      for (const auto& [attr, v] : aligns)
        check(lib.cublasLtMatmulPreferenceSetAttribute(pref.value, attr, &v, sizeof(v)),
              "cublasLtMatmulPreferenceSetAttribute");
      cublasLtMatmulHeuristicResult_t result{};
      int count = 0;
      const cublasStatus_t s = lib.cublasLtMatmulAlgoGetHeuristic(handle, desc.value, la.value, lb.value, ld.value,
                                                                  ld.value, pref.value, 1, &result, &count);
      const bool usable = s == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS;
      found = h.algos.emplace(key, Choice{usable, result.algo, usable ? result.workspaceSize : 0}).first;
    }
    choice = found->second;
    if (!choice.usable) return false;  // cuBLASLt has no algorithm for this case
  }
  const Scratch workspace(scratch, choice.workspace, static_cast<cudaStream_t>(stream));
  if (choice.workspace && !workspace.data()) return false;  // no room: opforge's own kernel needs none
  const float alpha_f = static_cast<float>(alpha), beta_f = accumulate ? 1.f : 0.f;
  const double alpha_d = alpha, beta_d = accumulate ? 1.0 : 0.0;
  const bool wide = scale == CUDA_R_64F;
  const cublasStatus_t s =
      lib.cublasLtMatmul(handle, desc.value, wide ? static_cast<const void*>(&alpha_d) : &alpha_f, b.data, la.value, a.data,
                         lb.value, wide ? static_cast<const void*>(&beta_d) : &beta_f, out, ld.value, out, ld.value,
                         &choice.algo, workspace.data(), choice.workspace, static_cast<cudaStream_t>(stream));
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
    // Refused before launching anything (the heuristic offered the algorithm, the call declined
    // it): remember, and let the caller run its own kernel.
    std::lock_guard<std::mutex> lock(handles().mutex);
    handles().algos[key].usable = false;
    return false;
  }
  check(s, "cublasLtMatmul");
  return true;
}

}  // namespace

bool matmul(const char* op, DType dtype, int64_t m, int64_t n, int64_t k, Operand a, Operand b, const void* bias,
            void* out, DType out_dtype, void* stream, ScratchAllocator* scratch, bool accumulate, double scale) {
  if (!enabled.load()) return false;
  const bool ran =
      matmul_or_decline(op, dtype, m, n, k, a, b, bias, out, out_dtype, stream, scratch, accumulate, scale);
  ++(ran ? taken : declined);
  return ran;
}

#endif  // OPFORGE_WITH_CUBLASLT

}  // namespace opforge::cuda::blaslt
