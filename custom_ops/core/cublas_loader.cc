#include "cublas_loader.h"

#include <dlfcn.h>

#include <algorithm>
#include <unordered_map>

namespace tf_rnnt {

namespace {

using CreateFn = cublasStatus_t (*)(cublasHandle_t*);
using SetStreamFn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
using SetMathModeFn = cublasStatus_t (*)(cublasHandle_t, cublasMath_t);
using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType_t, int, const void*,
                                    cudaDataType_t, int, const void*, void*, cudaDataType_t, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);

struct CublasApi {
  CreateFn create = nullptr;
  SetStreamFn set_stream = nullptr;
  SetMathModeFn set_math_mode = nullptr;
  GemmExFn gemm_ex = nullptr;
  bool ok() const { return create && set_stream && set_math_mode && gemm_ex; }
};

const CublasApi& api() {
  static const CublasApi loaded = [] {
    CublasApi a;
    // The CUDA 12 name first (TensorFlow 2.17-2.21 pip builds), then newer/older ones.
    const char* names[] = {"libcublas.so.12", "libcublas.so.13", "libcublas.so.11", "libcublas.so"};
    void* lib = nullptr;
    for (const char* name : names) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_NOLOAD))) break;
    }
    for (const char* name : names) {
      if (lib) break;
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    }
    if (!lib) return a;
    a.create = reinterpret_cast<CreateFn>(dlsym(lib, "cublasCreate_v2"));
    a.set_stream = reinterpret_cast<SetStreamFn>(dlsym(lib, "cublasSetStream_v2"));
    a.set_math_mode = reinterpret_cast<SetMathModeFn>(dlsym(lib, "cublasSetMathMode"));
    a.gemm_ex = reinterpret_cast<GemmExFn>(dlsym(lib, "cublasGemmEx"));
    return a;
  }();
  return loaded;
}

Status blas_error(const char* message) {
  Status s;
  s.code = StatusCode::kBlasError;
  s.message = message;
  return s;
}

}  // namespace

Status cublas_handle_for(cudaStream_t stream, cublasHandle_t* handle) {
  const CublasApi& a = api();
  if (!a.ok()) return blas_error("cuBLAS (libcublas.so.12) could not be loaded");
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return blas_error("cudaGetDevice failed");
  // Handles live for the process (destroying them at exit races the driver's own teardown).
  thread_local std::unordered_map<int, cublasHandle_t> handles;
  auto it = handles.find(device);
  if (it == handles.end()) {
    cublasHandle_t h = nullptr;
    if (a.create(&h) != CUBLAS_STATUS_SUCCESS) return blas_error("cublasCreate failed");
    if (a.set_math_mode(
            h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                         CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)) !=
        CUBLAS_STATUS_SUCCESS) {
      return blas_error("cublasSetMathMode failed");
    }
    it = handles.emplace(device, h).first;
  }
  if (a.set_stream(it->second, stream) != CUBLAS_STATUS_SUCCESS) {
    return blas_error("cublasSetStream failed");
  }
  *handle = it->second;
  return Status();
}

Status gemm_row_major(cublasHandle_t handle, bool trans_a, bool trans_b, int m, int n, int k,
                      const void* a, cudaDataType_t a_type, int lda, const void* b,
                      cudaDataType_t b_type, int ldb, float beta, void* c, cudaDataType_t c_type,
                      int ldc, bool allow_tf32) {
  if (m == 0 || n == 0) return Status();
  // k = 0 (H = 0) makes C = beta C, but cuBLAS still wants leading dimensions of at least 1.
  lda = std::max(lda, 1);
  ldb = std::max(ldb, 1);
  const float alpha = 1.f;
  const cublasComputeType_t compute = (allow_tf32 && a_type == CUDA_R_32F && b_type == CUDA_R_32F)
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  const cublasStatus_t st = api().gemm_ex(
      handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
      &alpha, b, b_type, ldb, a, a_type, lda, &beta, c, c_type, ldc, compute, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) return blas_error("cublasGemmEx failed");
  return Status();
}

}  // namespace tf_rnnt
