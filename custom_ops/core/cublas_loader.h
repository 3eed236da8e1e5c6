// cuBLAS through the library the process has already loaded (TensorFlow's), found with dlopen:
// tf_rnnt adds no runtime dependency and never links a second cuBLAS.
#ifndef TF_RNNT_CUBLAS_LOADER_H_
#define TF_RNNT_CUBLAS_LOADER_H_

#include <cuda_runtime.h>
#include <library_types.h>

#include "tf_rnnt/rnnt_core.h"

// The few cuBLAS declarations used here (stable ABI since CUDA 11), so no cuBLAS header or
// library is needed at build time.
typedef struct cublasContext* cublasHandle_t;
enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0 };
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
enum cublasMath_t {
  CUBLAS_DEFAULT_MATH = 0,
  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16
};

namespace tf_rnnt {

// A cuBLAS handle of the calling thread for the current device, bound to stream.
// Handles are per thread, so concurrent ops never share one. They disallow reduced-precision
// reductions: a split-K GEMM with a 16-bit output sums its parts in float32 too.
Status cublas_handle_for(cudaStream_t stream, cublasHandle_t* handle);

// Row-major C[m, n] (ldc) = alpha * op(A)[m, k] @ op(B)[k, n] + beta * C, via cublasGemmEx.
// A/B in a_type/b_type, C in c_type, float accumulation (TF32 when allow_tf32 and both are float).
Status gemm_row_major(cublasHandle_t handle, bool trans_a, bool trans_b, int m, int n, int k,
                      const void* a, cudaDataType_t a_type, int lda, const void* b,
                      cudaDataType_t b_type, int ldb, float beta, void* c, cudaDataType_t c_type,
                      int ldc, bool allow_tf32);

}  // namespace tf_rnnt

#endif  // TF_RNNT_CUBLAS_LOADER_H_
