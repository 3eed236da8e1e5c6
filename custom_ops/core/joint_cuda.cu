// CUDA fused joint ("Flash RNN-T"). Per tile of packed lattice nodes:
//   forward:  z = act(enc + pred) -> logits = z @ kernel (cuBLAS, tensor cores) -> online
//             log-sum-exp with bias + blank/label picks (one warp per node);
//   backward: recompute z and logits (tiled mode), d logits from the two per-node gradients in
//             place, d hidden = d logits @ kernel^T and d kernel += z^T @ d logits (cuBLAS),
//             d bias, d encoder and d predictor by ordered reductions (no atomics: deterministic).
#include <cuda_runtime.h>

#include <algorithm>

#include "cublas_loader.h"
#include "tf_rnnt/dtype_cuda.cuh"
#include "tf_rnnt/node_math.h"
#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {

namespace {

constexpr int kWarps = 8;           // warps per block in the per-node kernels

template <typename T>
cudaDataType_t cuda_type();
template <>
cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <>
cudaDataType_t cuda_type<__half>() { return CUDA_R_16F; }
template <>
cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }

size_t align_up(size_t bytes) { return (bytes + 255) & ~size_t(255); }

__global__ void node_offsets_kernel(const int32_t* logit_lengths, const int32_t* label_lengths,
                                    int B, int64_t* offsets) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    offsets[0] = 0;
    for (int b = 0; b < B; ++b) {
      offsets[b + 1] = offsets[b] + static_cast<int64_t>(logit_lengths[b]) * (label_lengths[b] + 1);
    }
  }
}

// Kp [Hp, Vp] = [[kernel, 0], [bias, 0], [0, 0]]: with a ones column in z, z @ Kp adds the bias
// and z^T @ d logits yields d bias in row H. Padding keeps every GEMM operand 16-byte aligned.
template <typename T>
__global__ void padded_kernel_kernel(const T* __restrict__ kernel, const T* __restrict__ bias, int H,
                                     int V, int Hp, int Vp, T* __restrict__ out) {
  const int64_t total = static_cast<int64_t>(Hp) * Vp;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int h = static_cast<int>(i / Vp), v = static_cast<int>(i % Vp);
    T x = from_float<T>(0.f);
    if (v < V && h < H) x = kernel[static_cast<int64_t>(h) * V + v];
    if (v < V && h == H) x = bias[v];
    out[i] = x;
  }
}

// d kernel and d bias out of the padded accumulator.
__global__ void unpad_grad_kernel(const float* __restrict__ padded, int H, int V, int Vp,
                                  float* __restrict__ d_kernel, float* __restrict__ d_bias) {
  const int64_t total = static_cast<int64_t>(H + 1) * V;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int h = static_cast<int>(i / V), v = static_cast<int>(i % V);
    const float g = padded[static_cast<int64_t>(h) * Vp + v];
    if (h < H) d_kernel[i] = g; else d_bias[v] = g;
  }
}

// z[n - n0] = (act(encoder[b, t] + predictor[b, u]), 1, 0...): one block per node, threads over Hp.
template <typename T>
__global__ void hidden_kernel(int64_t n0, int64_t rows, const T* __restrict__ encoder,
                              const T* __restrict__ predictor, const int64_t* __restrict__ offsets,
                              const int32_t* __restrict__ label_lengths, int B, int T_max, int U1,
                              int H, int Hp, int activation, T* __restrict__ z) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const NodeIndex i = locate_node(n0 + r, offsets, B, label_lengths);
    const T* e = encoder + (static_cast<int64_t>(i.b) * T_max + i.t) * H;
    const T* p = predictor + (static_cast<int64_t>(i.b) * U1 + i.u) * H;
    T* out = z + r * Hp;
    for (int h = threadIdx.x; h < Hp; h += blockDim.x) {
      const float x = h < H ? activate(to_float(e[h]) + to_float(p[h]), activation)
                            : (h == H ? 1.f : 0.f);
      out[h] = from_float<T>(x);
    }
  }
}

// Online log-sum-exp of the logits (bias included by the GEMM) and the picks, a warp per node.
__global__ void picks_kernel(int64_t n0, int64_t rows, const float* __restrict__ logits,
                             const int32_t* __restrict__ labels,
                             const int64_t* __restrict__ offsets,
                             const int32_t* __restrict__ label_lengths, int B, int T_max, int U1,
                             int V, int Vp, int blank, float* __restrict__ lattice,
                             float* __restrict__ lse) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + (threadIdx.x >> 5); r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const float* row = logits + r * Vp;
    LseState s = lse_init();
    for (int v = lane; v < V; v += 32) s = lse_push(s, row[v]);
    s = warp_lse(s);
    if (lane == 0) {
      const int64_t n = n0 + r;
      const NodeIndex i = locate_node(n, offsets, B, label_lengths);
      const float total = lse_value(s);
      const int64_t padded = (static_cast<int64_t>(i.b) * T_max + i.t) * U1 + i.u;
      lse[n] = total;
      lattice[2 * padded] = row[blank] - total;
      if (i.u < label_lengths[i.b]) {
        const int label = labels[static_cast<int64_t>(i.b) * (U1 - 1) + i.u];
        lattice[2 * padded + 1] = row[label] - total;
      }
    }
  }
}

// d logits from the per-node lattice gradients (may write over the float logits, row by row);
// zeros in the padding columns so the GEMMs that read d logits see no garbage.
template <typename T>
__global__ void logit_grads_kernel(int64_t n0, int64_t rows, const float* logits,
                                   const int32_t* __restrict__ labels,
                                   const int64_t* __restrict__ offsets,
                                   const int32_t* __restrict__ label_lengths, int B, int T_max,
                                   int U1, int V, int Vp, int blank, const float* __restrict__ lse,
                                   const float* __restrict__ d_lattice, T* d_logits) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + (threadIdx.x >> 5); r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t n = n0 + r;
    const NodeIndex i = locate_node(n, offsets, B, label_lengths);
    const int64_t padded = (static_cast<int64_t>(i.b) * T_max + i.t) * U1 + i.u;
    const bool has_label = i.u < label_lengths[i.b];
    const int label = has_label ? labels[static_cast<int64_t>(i.b) * (U1 - 1) + i.u] : -1;
    const float g_blank = d_lattice[2 * padded];
    const float g_label = has_label ? d_lattice[2 * padded + 1] : 0.f;
    const float total = lse[n];
    const float* row = logits + r * Vp;
    T* out = d_logits + r * Vp;
    for (int v = lane; v < Vp; v += 32) {
      const float g = v < V ? logit_grad(row[v], total, v, blank, label, g_blank, g_label) : 0.f;
      out[v] = from_float<T>(g);
    }
  }
}

// d encoder[b, t] += sum over the tile's nodes (b, t, u) of d hidden * act'(z).
// One block per node that starts a (b, t) run inside the tile (u == 0 or the tile's first node);
// blockIdx.y splits H so that enough blocks are in flight.
template <typename T>
__global__ void encoder_grad_kernel(int64_t n0, int64_t rows, const float* __restrict__ d_hidden,
                                    const T* __restrict__ z, const int64_t* __restrict__ offsets,
                                    const int32_t* __restrict__ label_lengths, int B, int T_max,
                                    int H, int Hp, int activation, float* __restrict__ d_encoder) {
  const int h = blockIdx.y * blockDim.x + threadIdx.x;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const NodeIndex i = locate_node(n0 + r, offsets, B, label_lengths);
    if ((i.u != 0 && r != 0) || h >= H) continue;
    const int64_t row_rest = label_lengths[i.b] + 1 - i.u;
    const int run = static_cast<int>(row_rest < rows - r ? row_rest : rows - r);
    const float* dh = d_hidden + r * Hp + h;
    const T* zz = z + r * Hp + h;
    float acc0 = 0.f, acc1 = 0.f;  // two chains for memory-level parallelism; fixed order
    int k = 0;
    for (; k + 1 < run; k += 2) {
      acc0 += dh[k * Hp] * activation_grad(to_float(zz[k * Hp]), activation);
      acc1 += dh[(k + 1) * Hp] * activation_grad(to_float(zz[(k + 1) * Hp]), activation);
    }
    if (k < run) acc0 += dh[k * Hp] * activation_grad(to_float(zz[k * Hp]), activation);
    d_encoder[(static_cast<int64_t>(i.b) * T_max + i.t) * H + h] += acc0 + acc1;
  }
}

// d predictor[b, u] += sum over the tile's nodes (b, t, u) of d hidden * act'(z).
// One block per (b, u) and slice of H; t runs over the frames whose node falls in the tile.
template <typename T>
__global__ void predictor_grad_kernel(int64_t n0, int64_t rows, const float* __restrict__ d_hidden,
                                      const T* __restrict__ z, const int64_t* __restrict__ offsets,
                                      const int32_t* __restrict__ logit_lengths,
                                      const int32_t* __restrict__ label_lengths, int B, int U1,
                                      int H, int Hp, int activation, float* __restrict__ d_predictor) {
  const int64_t n1 = n0 + rows;
  const int h = blockIdx.y * blockDim.x + threadIdx.x;
  if (h >= H) return;
  for (int64_t pair = blockIdx.x; pair < static_cast<int64_t>(B) * U1; pair += gridDim.x) {
    const int b = static_cast<int>(pair / U1), u = static_cast<int>(pair % U1);
    const int U1_b = label_lengths[b] + 1;
    if (u >= U1_b || offsets[b + 1] <= n0 || offsets[b] >= n1) continue;
    // node(t) = offsets[b] + t * U1_b + u must lie in [n0, n1).
    const int64_t first = n0 - offsets[b] - u;
    const int t_lo = first <= 0 ? 0 : static_cast<int>((first + U1_b - 1) / U1_b);
    const int64_t last = n1 - offsets[b] - u;  // exclusive
    const int64_t t_end = (last + U1_b - 1) / U1_b;
    const int t_hi = last <= 0 ? 0 : static_cast<int>(t_end < logit_lengths[b] ? t_end : logit_lengths[b]);
    if (t_lo >= t_hi) continue;
    const int64_t stride = static_cast<int64_t>(U1_b) * Hp;
    const int64_t base = (offsets[b] + static_cast<int64_t>(t_lo) * U1_b + u - n0) * Hp + h;
    const int count = t_hi - t_lo;
    float acc0 = 0.f, acc1 = 0.f, acc2 = 0.f, acc3 = 0.f;  // four chains; fixed order
    int k = 0;
    for (; k + 3 < count; k += 4) {
      const int64_t i0 = base + k * stride;
      acc0 += d_hidden[i0] * activation_grad(to_float(z[i0]), activation);
      acc1 += d_hidden[i0 + stride] * activation_grad(to_float(z[i0 + stride]), activation);
      acc2 += d_hidden[i0 + 2 * stride] * activation_grad(to_float(z[i0 + 2 * stride]), activation);
      acc3 += d_hidden[i0 + 3 * stride] * activation_grad(to_float(z[i0 + 3 * stride]), activation);
    }
    for (; k < count; ++k) {
      const int64_t i0 = base + k * stride;
      acc0 += d_hidden[i0] * activation_grad(to_float(z[i0]), activation);
    }
    d_predictor[(static_cast<int64_t>(b) * U1 + u) * H + h] += (acc0 + acc1) + (acc2 + acc3);
  }
}

template <typename T>
__global__ void cast_kernel(const float* __restrict__ in, T* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_float<T>(in[i]);
  }
}

int block_threads(int H) { return H >= 256 ? 256 : ((H + 31) / 32) * 32; }
int grid_rows(int64_t rows) { return static_cast<int>(std::min<int64_t>(rows, 1 << 16)); }
int grid_warps(int64_t rows) {
  return static_cast<int>(std::min<int64_t>((rows + kWarps - 1) / kWarps, 1 << 16));
}

#define RETURN_IF_ERROR(expr)          \
  do {                                 \
    const Status _status = (expr);     \
    if (!_status.ok()) return _status; \
  } while (0)

struct Workspace {
  char* next;
  template <typename P>
  P* take(size_t bytes) {
    P* p = reinterpret_cast<P*>(next);
    next += align_up(bytes);
    return p;
  }
};

template <typename T>
Status forward(const JointShape& s, const JointForwardArgs& a, cudaStream_t stream) {
  const int H = s.H, V = s.V, Hp = joint_hidden_width(s, true), Vp = joint_logits_width(s, true);
  RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(
      a.lattice, 0, sizeof(float) * 2 * static_cast<size_t>(s.B) * s.T * s.U1, stream)));
  if (a.num_nodes == 0) return Status();
  cublasHandle_t handle;
  RETURN_IF_ERROR(cublas_handle_for(stream, &handle));
  const bool untiled = a.saved_logits != nullptr;
  const int64_t tile = untiled ? a.num_nodes : a.tile_nodes;
  Workspace ws{static_cast<char*>(a.workspace)};
  T* kernel = ws.take<T>(sizeof(T) * Hp * Vp);
  T* tile_z = untiled ? nullptr : ws.take<T>(sizeof(T) * tile * Hp);
  float* tile_logits = untiled ? nullptr : ws.take<float>(sizeof(float) * tile * Vp);
  padded_kernel_kernel<T><<<blocks_for(static_cast<int64_t>(Hp) * Vp, 256), 256, 0, stream>>>(
      static_cast<const T*>(a.kernel), static_cast<const T*>(a.bias), H, V, Hp, Vp, kernel);
  for (int64_t n0 = 0; n0 < a.num_nodes; n0 += tile) {
    const int64_t rows = std::min(tile, a.num_nodes - n0);
    T* z = untiled ? static_cast<T*>(a.saved_hidden) : tile_z;
    float* logits = untiled ? a.saved_logits : tile_logits;
    hidden_kernel<T><<<grid_rows(rows), block_threads(Hp), 0, stream>>>(
        n0, rows, static_cast<const T*>(a.encoder), static_cast<const T*>(a.predictor),
        a.node_offsets, a.label_lengths, s.B, s.T, s.U1, H, Hp, s.activation, z);
    RETURN_IF_ERROR(gemm_row_major(handle, false, false, static_cast<int>(rows), Vp, Hp, z,
                                   cuda_type<T>(), Hp, kernel, cuda_type<T>(), Vp, 0.f, logits,
                                   CUDA_R_32F, Vp, s.allow_tf32));
    picks_kernel<<<grid_warps(rows), 32 * kWarps, 0, stream>>>(
        n0, rows, logits, a.labels, a.node_offsets, a.label_lengths, s.B, s.T, s.U1, V, Vp,
        s.blank, a.lattice, a.lse);
    RETURN_IF_ERROR(last_launch_status());
  }
  return Status();
}

template <typename T>
Status backward(const JointShape& s, const JointBackwardArgs& a, cudaStream_t stream) {
  const int H = s.H, V = s.V, Hp = joint_hidden_width(s, true), Vp = joint_logits_width(s, true);
  RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(
      a.d_encoder, 0, sizeof(float) * static_cast<size_t>(s.B) * s.T * H, stream)));
  RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(
      a.d_predictor, 0, sizeof(float) * static_cast<size_t>(s.B) * s.U1 * H, stream)));
  RETURN_IF_ERROR(
      cuda_status(cudaMemsetAsync(a.d_kernel, 0, sizeof(float) * static_cast<size_t>(H) * V, stream)));
  RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(a.d_bias, 0, sizeof(float) * V, stream)));
  if (a.num_nodes == 0) return Status();
  cublasHandle_t handle;
  RETURN_IF_ERROR(cublas_handle_for(stream, &handle));
  const bool untiled = a.saved_logits != nullptr;
  const bool float_io = sizeof(T) == sizeof(float);
  const int64_t tile = untiled ? a.num_nodes : a.tile_nodes;
  Workspace ws{static_cast<char*>(a.workspace)};
  T* kernel = ws.take<T>(sizeof(T) * Hp * Vp);
  float* d_kernel = ws.take<float>(sizeof(float) * Hp * Vp);  // rows H: d kernel, row H: d bias
  T* tile_z = untiled ? nullptr : ws.take<T>(sizeof(T) * tile * Hp);
  float* tile_logits = untiled ? nullptr : ws.take<float>(sizeof(float) * tile * Vp);
  T* tile_d_logits = float_io ? nullptr : ws.take<T>(sizeof(T) * tile * Vp);
  float* d_hidden = ws.take<float>(sizeof(float) * tile * Hp);
  padded_kernel_kernel<T><<<blocks_for(static_cast<int64_t>(Hp) * Vp, 256), 256, 0, stream>>>(
      static_cast<const T*>(a.kernel), static_cast<const T*>(a.bias), H, V, Hp, Vp, kernel);
  RETURN_IF_ERROR(cuda_status(
      cudaMemsetAsync(d_kernel, 0, sizeof(float) * static_cast<size_t>(Hp) * Vp, stream)));
  const int h_threads = H >= 128 ? 128 : ((H + 31) / 32) * 32;
  const int h_slices = (H + h_threads - 1) / h_threads;
  for (int64_t n0 = 0; n0 < a.num_nodes; n0 += tile) {
    const int64_t rows = std::min(tile, a.num_nodes - n0);
    const T* z;
    float* logits;
    if (untiled) {
      z = static_cast<const T*>(a.saved_hidden);
      logits = a.saved_logits;
    } else {  // recompute the tile (activation checkpointing)
      hidden_kernel<T><<<grid_rows(rows), block_threads(Hp), 0, stream>>>(
          n0, rows, static_cast<const T*>(a.encoder), static_cast<const T*>(a.predictor),
          a.node_offsets, a.label_lengths, s.B, s.T, s.U1, H, Hp, s.activation, tile_z);
      RETURN_IF_ERROR(gemm_row_major(handle, false, false, static_cast<int>(rows), Vp, Hp, tile_z,
                                     cuda_type<T>(), Hp, kernel, cuda_type<T>(), Vp, 0.f,
                                     tile_logits, CUDA_R_32F, Vp, s.allow_tf32));
      z = tile_z;
      logits = tile_logits;
    }
    T* d_logits = float_io ? reinterpret_cast<T*>(logits) : tile_d_logits;
    logit_grads_kernel<T><<<grid_warps(rows), 32 * kWarps, 0, stream>>>(
        n0, rows, logits, a.labels, a.node_offsets, a.label_lengths, s.B, s.T, s.U1, V, Vp,
        s.blank, a.lse, a.d_lattice, d_logits);
    // d hidden = d logits @ Kp^T;  [d kernel; d bias] += z^T @ d logits (ordered over tiles).
    RETURN_IF_ERROR(gemm_row_major(handle, false, true, static_cast<int>(rows), Hp, Vp, d_logits,
                                   cuda_type<T>(), Vp, kernel, cuda_type<T>(), Vp, 0.f, d_hidden,
                                   CUDA_R_32F, Hp, s.allow_tf32));
    RETURN_IF_ERROR(gemm_row_major(handle, true, false, Hp, Vp, static_cast<int>(rows), z,
                                   cuda_type<T>(), Hp, d_logits, cuda_type<T>(), Vp, 1.f, d_kernel,
                                   CUDA_R_32F, Vp, s.allow_tf32));
    encoder_grad_kernel<T><<<dim3(grid_rows(rows), h_slices), h_threads, 0, stream>>>(
        n0, rows, d_hidden, z, a.node_offsets, a.label_lengths, s.B, s.T, H, Hp, s.activation,
        a.d_encoder);
    predictor_grad_kernel<T><<<dim3(grid_rows(static_cast<int64_t>(s.B) * s.U1), h_slices),
                               h_threads, 0, stream>>>(n0, rows, d_hidden, z, a.node_offsets,
                                                       a.logit_lengths, a.label_lengths, s.B, s.U1,
                                                       H, Hp, s.activation, a.d_predictor);
    RETURN_IF_ERROR(last_launch_status());
  }
  unpad_grad_kernel<<<blocks_for(static_cast<int64_t>(H + 1) * V, 256), 256, 0, stream>>>(
      d_kernel, H, V, Vp, a.d_kernel, a.d_bias);
  return last_launch_status();
}

}  // namespace

size_t joint_workspace_bytes_cuda(const JointShape& s, int64_t tile_nodes, bool backward,
                                  bool untiled) {
  const size_t ds = dtype_size(s.dtype);
  const size_t tile = static_cast<size_t>(tile_nodes);
  const size_t Hp = joint_hidden_width(s, true), Vp = joint_logits_width(s, true);
  size_t bytes = align_up(ds * Hp * Vp);                                // padded kernel + bias
  if (!untiled) bytes += align_up(ds * tile * Hp) + align_up(4 * tile * Vp);  // z, logits
  if (backward) {
    bytes += align_up(4 * Hp * Vp);                    // [d kernel; d bias] accumulator
    if (ds != 4) bytes += align_up(ds * tile * Vp);    // d logits in the input dtype
    bytes += align_up(4 * tile * Hp);                  // d hidden
  }
  return bytes;
}

Status joint_node_offsets_cuda(const int32_t* logit_lengths, const int32_t* label_lengths, int B,
                               int64_t* offsets, GpuStream stream) {
  node_offsets_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(logit_lengths,
                                                                      label_lengths, B, offsets);
  return last_launch_status();
}

Status cast_float_cuda(const float* in, void* out, DType dtype, int64_t n, GpuStream stream) {
  if (n == 0) return Status();
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype_cuda(dtype, [&](auto tag) {
    using Tv = decltype(tag);
    cast_kernel<Tv><<<blocks_for(n, 256), 256, 0, s>>>(in, static_cast<Tv*>(out), n);
  });
  return last_launch_status();
}

Status copy_cuda(void* dst, const void* src, size_t bytes, GpuStream stream) {
  return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                     static_cast<cudaStream_t>(stream)));
}

Status joint_forward_cuda(const JointShape& shape, const JointForwardArgs& args, GpuStream stream) {
  Status status;
  dispatch_dtype_cuda(shape.dtype, [&](auto tag) {
    status = forward<decltype(tag)>(shape, args, static_cast<cudaStream_t>(stream));
  });
  return status;
}

Status joint_backward_cuda(const JointShape& shape, const JointBackwardArgs& args,
                           GpuStream stream) {
  Status status;
  dispatch_dtype_cuda(shape.dtype, [&](auto tag) {
    status = backward<decltype(tag)>(shape, args, static_cast<cudaStream_t>(stream));
  });
  return status;
}

}  // namespace tf_rnnt
