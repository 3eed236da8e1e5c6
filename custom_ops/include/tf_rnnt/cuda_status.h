// The core's Status of a CUDA runtime error, for host code built with or without nvcc.
#ifndef TF_RNNT_CUDA_STATUS_H_
#define TF_RNNT_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {

inline Status cuda_status(cudaError_t err) {
  Status s;
  if (err != cudaSuccess) {
    s.code = StatusCode::kCudaError;
    s.message = cudaGetErrorName(err);
  }
  return s;
}

}  // namespace tf_rnnt

#endif  // TF_RNNT_CUDA_STATUS_H_
