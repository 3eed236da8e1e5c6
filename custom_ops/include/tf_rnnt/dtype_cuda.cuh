// Device conversions for the three float formats and a launcher-side dtype switch.
#ifndef TF_RNNT_DTYPE_CUDA_CUH_
#define TF_RNNT_DTYPE_CUDA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "tf_rnnt/cuda_status.h"
#include "tf_rnnt/node_math.h"
#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename Fn>
void dispatch_dtype_cuda(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      fn(float());
      break;
    case DType::kFloat16:
      fn(__half());
      break;
    case DType::kBFloat16:
      fn(__nv_bfloat16());
      break;
  }
}

inline Status last_launch_status() { return cuda_status(cudaGetLastError()); }

inline int blocks_for(int64_t n, int threads, int64_t cap = 65535LL * 8) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<int>(b < cap ? b : cap);
}

// Threads of a block that walks a sample's anti-diagonals over u: U1 in whole warps, at most 1024.
inline int diagonal_threads(int U1) { return U1 >= 1024 ? 1024 : ((U1 + 31) / 32) * 32; }

// Node i of a [B, T, U1] lattice as its sample b and position (t, u).
struct LatticeNode {
  int b, t, u;
};
__device__ __forceinline__ LatticeNode lattice_node(int64_t i, int T, int U1) {
  return {static_cast<int>(i / (static_cast<int64_t>(T) * U1)), static_cast<int>((i / U1) % T),
          static_cast<int>(i % U1)};
}

// Warp-level merge of online log-sum-exp states (lane 0 ends with the row's state).
__device__ __forceinline__ LseState warp_lse(LseState s) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    LseState o;
    o.max = __shfl_xor_sync(0xffffffffu, s.max, offset);
    o.sum = __shfl_xor_sync(0xffffffffu, s.sum, offset);
    s = lse_merge(s, o);
  }
  return s;
}

// act(x) for a tile of type T. bfloat16 tiles take the hardware tanh (tanh.approx.f32, relative
// error under 2^-10.9), which their rounding to 8 significant bits hides; the others keep tanhf.
template <typename T>
__device__ __forceinline__ float tile_activate(float x, Activation activation) {
  if (std::is_same<T, __nv_bfloat16>::value && activation == Activation::kTanh) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
  }
  return activate(x, activation);
}

}  // namespace tf_rnnt

#endif  // TF_RNNT_DTYPE_CUDA_CUH_
