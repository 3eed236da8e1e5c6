// CUDA fused joint ("Flash RNN-T"). Per tile of packed lattice nodes:
//   forward:  z = act(enc + pred) -> logits = z @ kernel (cuBLAS, tensor cores) -> online
//             log-sum-exp of logits + bias and the blank/label picks (one warp per node);
//   backward: recompute z and logits (tiled mode), d logits from the two per-node gradients in
//             place, [d kernel; d bias] += [z, 1]^T @ d logits and d hidden = d logits @ kernel^T
//             (cuBLAS; d hidden over z's buffer), then d encoder and d predictor by ordered
//             reductions of d hidden * act'(enc + pred) (no atomics: deterministic).
// z rows are Hz = joint_hidden_width wide: H activations, a ones column (its d kernel row is
// d bias), zeros; the GEMMs over H use Hk = H rounded up to 8 columns, so the ones column costs
// only the d kernel GEMM an extra row.
// Tiled mode keeps the logits tile in the input dtype (float32 accumulation, then rounded, as a
// Keras mixed-precision Dense layer does); the log-sum-exp and the lattice stay float32.
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

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

// Kp [Hk, Vp] = [[kernel, 0], [0, 0]]: the zero padding keeps every GEMM operand 16-byte aligned.
template <typename T>
__global__ void padded_kernel_kernel(const T* __restrict__ kernel, int H, int V, int Hk, int Vp,
                                     T* __restrict__ out) {
  const int64_t total = static_cast<int64_t>(Hk) * Vp;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int h = static_cast<int>(i / Vp), v = static_cast<int>(i % Vp);
    out[i] = (v < V && h < H) ? kernel[static_cast<int64_t>(h) * V + v] : from_float<T>(0.f);
  }
}

// bias as float32 [Vp], -inf in the padding columns (they then drop out of the log-sum-exp).
template <typename T>
__global__ void padded_bias_kernel(const T* __restrict__ bias, int V, int Vp,
                                   float* __restrict__ out) {
  for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < Vp; v += gridDim.x * blockDim.x) {
    out[v] = v < V ? to_float(bias[v]) : kNegInf;
  }
}

// n values of type P moved as one vector access.
template <typename P, int n>
struct alignas(sizeof(P) * n) Pack {
  P x[n];
};

// d kernel (rows < H) and d bias (row H) out of the padded accumulator.
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

// z[n - n0] = (act(encoder[b, t] + predictor[b, u]), 1, 0...): a warp per node, 16-byte loads
// and stores when H allows them.
template <typename T>
__global__ void hidden_kernel(int64_t n0, int64_t rows, const T* __restrict__ encoder,
                              const T* __restrict__ predictor, const int64_t* __restrict__ offsets,
                              const int32_t* __restrict__ label_lengths, int B, int T_max, int U1,
                              int H, int Hz, int activation, T* __restrict__ z) {
  constexpr int kPack = 16 / sizeof(T);
  const int lane = threadIdx.x & 31;
  const bool packed = H % kPack == 0;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + (threadIdx.x >> 5); r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const NodeIndex i = locate_node(n0 + r, offsets, B, label_lengths);
    const T* e = encoder + (static_cast<int64_t>(i.b) * T_max + i.t) * H;
    const T* p = predictor + (static_cast<int64_t>(i.b) * U1 + i.u) * H;
    T* out = z + r * Hz;
    if (packed) {
      for (int h = lane * kPack; h < H; h += 32 * kPack) {
        const uint4 e_bits = *reinterpret_cast<const uint4*>(e + h);
        const uint4 p_bits = *reinterpret_cast<const uint4*>(p + h);
        const T* ev = reinterpret_cast<const T*>(&e_bits);
        const T* pv = reinterpret_cast<const T*>(&p_bits);
        uint4 out_bits;
        T* ov = reinterpret_cast<T*>(&out_bits);
#pragma unroll
        for (int k = 0; k < kPack; ++k) {
          ov[k] = from_float<T>(activate(to_float(ev[k]) + to_float(pv[k]), activation));
        }
        *reinterpret_cast<uint4*>(out + h) = out_bits;
      }
    } else {
      for (int h = lane; h < H; h += 32) {
        out[h] = from_float<T>(activate(to_float(e[h]) + to_float(p[h]), activation));
      }
    }
    for (int h = H + lane; h < Hz; h += 32) out[h] = from_float<T>(h == H ? 1.f : 0.f);
  }
}

// Online log-sum-exp of logits + bias and the picks, a warp per node; each lane reads 16 bytes
// of the row at a time (rows are Vp wide, a multiple of 8, so every pack is aligned).
template <typename L>
__global__ void picks_kernel(int64_t n0, int64_t rows, const L* __restrict__ logits,
                             const float* __restrict__ bias, const int32_t* __restrict__ labels,
                             const int64_t* __restrict__ offsets,
                             const int32_t* __restrict__ label_lengths, int B, int T_max, int U1,
                             int Vp, int blank, float* __restrict__ lattice,
                             float* __restrict__ lse) {
  constexpr int kPack = 16 / sizeof(L);
  const int lane = threadIdx.x & 31;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + (threadIdx.x >> 5); r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const L* row = logits + r * Vp;
    LseState s = lse_init();
    for (int v = lane * kPack; v < Vp; v += 32 * kPack) {
      const Pack<L, kPack> packed = *reinterpret_cast<const Pack<L, kPack>*>(row + v);
      float x[kPack];
#pragma unroll
      for (int k = 0; k < kPack; ++k) x[k] = to_float(packed.x[k]) + bias[v + k];
      s = lse_push_block(s, x);
    }
    s = warp_lse(s);
    if (lane == 0) {
      const int64_t n = n0 + r;
      const NodeIndex i = locate_node(n, offsets, B, label_lengths);
      const float total = lse_value(s);
      const int64_t padded = (static_cast<int64_t>(i.b) * T_max + i.t) * U1 + i.u;
      lse[n] = total;
      lattice[2 * padded] = to_float(row[blank]) + bias[blank] - total;
      if (i.u < label_lengths[i.b]) {
        const int label = labels[static_cast<int64_t>(i.b) * (U1 - 1) + i.u];
        lattice[2 * padded + 1] = to_float(row[label]) + bias[label] - total;
      }
    }
  }
}

// d logits from the per-node lattice gradients (may write over the logits, pack by pack);
// zeros in the padding columns so the GEMMs that read d logits see no garbage.
template <typename L, typename T>
__global__ void logit_grads_kernel(int64_t n0, int64_t rows, const L* logits,
                                   const float* __restrict__ bias,
                                   const int32_t* __restrict__ labels,
                                   const int64_t* __restrict__ offsets,
                                   const int32_t* __restrict__ label_lengths, int B, int T_max,
                                   int U1, int V, int Vp, int blank, const float* __restrict__ lse,
                                   const float* __restrict__ d_lattice, T* d_logits) {
  constexpr int kPack = 16 / sizeof(L);
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
    const L* row = logits + r * Vp;
    T* out = d_logits + r * Vp;
    for (int v = lane * kPack; v < Vp; v += 32 * kPack) {
      const Pack<L, kPack> packed = *reinterpret_cast<const Pack<L, kPack>*>(row + v);
      Pack<T, kPack> grads;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float g = v + k < V ? logit_grad(to_float(packed.x[k]) + bias[v + k], total, v + k,
                                               blank, label, g_blank, g_label)
                                  : 0.f;
        grads.x[k] = from_float<T>(g);
      }
      *reinterpret_cast<Pack<T, kPack>*>(out + v) = grads;
    }
  }
}

// sum of term(k) for k < count in four interleaved chains (memory-level parallelism), added up
// in a fixed order, so the result does not depend on scheduling.
template <typename Term>
__device__ __forceinline__ float chained_sum(int count, Term term) {
  float acc0 = 0.f, acc1 = 0.f, acc2 = 0.f, acc3 = 0.f;
  int k = 0;
  for (; k + 3 < count; k += 4) {
    acc0 += term(k);
    acc1 += term(k + 1);
    acc2 += term(k + 2);
    acc3 += term(k + 3);
  }
  for (; k < count; ++k) acc0 += term(k);
  return (acc0 + acc1) + (acc2 + acc3);
}

// d encoder[b, t] += sum over the tile's nodes (b, t, u) of d hidden * act'(enc + pred); the
// activation is recomputed from the inputs (cached) instead of read back from z.
// Block x: the x-th (b, t) row that meets the tile, counted from the tile's first node's row
// (b0, t0); blockIdx.y splits H.
template <typename T>
__global__ void encoder_grad_kernel(int64_t n0, int64_t rows, int b0, int t0,
                                    const T* __restrict__ d_hidden, const T* __restrict__ encoder,
                                    const T* __restrict__ predictor,
                                    const int64_t* __restrict__ offsets,
                                    const int32_t* __restrict__ logit_lengths,
                                    const int32_t* __restrict__ label_lengths, int T_max, int U1,
                                    int H, int Hz, int activation,
                                    float* __restrict__ d_encoder) {
  const int h = blockIdx.y * blockDim.x + threadIdx.x;
  if (h >= H) return;
  int b = b0, t = t0 + static_cast<int>(blockIdx.x);
  while (t >= logit_lengths[b]) t -= logit_lengths[b++];
  const int U1_b = label_lengths[b] + 1;
  const int64_t row_start = offsets[b] + static_cast<int64_t>(t) * U1_b;
  const int64_t first = row_start > n0 ? row_start : n0;
  const int64_t end = row_start + U1_b < n0 + rows ? row_start + U1_b : n0 + rows;
  const int run = static_cast<int>(end - first);
  const int64_t e_index = (static_cast<int64_t>(b) * T_max + t) * H + h;
  const float e = to_float(encoder[e_index]);
  const T* p = predictor + (static_cast<int64_t>(b) * U1 + (first - row_start)) * H + h;
  const T* dh = d_hidden + (first - n0) * Hz + h;
  auto term = [&](int k) {
    const float y = activate(e + to_float(p[k * H]), activation);
    return to_float(dh[static_cast<int64_t>(k) * Hz]) * activation_grad(y, activation);
  };
  d_encoder[e_index] += chained_sum(run, term);
}

// d predictor[b, u] += sum over the tile's nodes (b, t, u) of d hidden * act'(enc + pred).
// Block x: the x-th (b, u) pair counted from (b0, 0), over the samples that meet the tile;
// blockIdx.y splits H; t runs over the frames whose node falls in the tile.
template <typename T>
__global__ void predictor_grad_kernel(int64_t n0, int64_t rows, int b0,
                                      const T* __restrict__ d_hidden,
                                      const T* __restrict__ encoder,
                                      const T* __restrict__ predictor,
                                      const int64_t* __restrict__ offsets,
                                      const int32_t* __restrict__ logit_lengths,
                                      const int32_t* __restrict__ label_lengths, int T_max,
                                      int U1, int H, int Hz, int activation,
                                      float* __restrict__ d_predictor) {
  const int h = blockIdx.y * blockDim.x + threadIdx.x;
  if (h >= H) return;
  int b = b0, u = static_cast<int>(blockIdx.x);
  while (u > label_lengths[b]) u -= label_lengths[b++] + 1;
  const int U1_b = label_lengths[b] + 1;
  const int64_t n1 = n0 + rows;
  // node(t) = offsets[b] + t * U1_b + u must lie in [n0, n1).
  const int64_t first = n0 - offsets[b] - u;
  const int t_lo = first <= 0 ? 0 : static_cast<int>((first + U1_b - 1) / U1_b);
  const int64_t last = n1 - offsets[b] - u;  // exclusive
  const int64_t t_end = (last + U1_b - 1) / U1_b;
  const int t_hi = last <= 0 ? 0 : static_cast<int>(t_end < logit_lengths[b] ? t_end : logit_lengths[b]);
  if (t_lo >= t_hi) return;
  const int64_t p_index = (static_cast<int64_t>(b) * U1 + u) * H + h;
  const float p = to_float(predictor[p_index]);
  const T* e = encoder + (static_cast<int64_t>(b) * T_max + t_lo) * H + h;
  const int64_t stride = static_cast<int64_t>(U1_b) * Hz;
  const T* dh = d_hidden + (offsets[b] + static_cast<int64_t>(t_lo) * U1_b + u - n0) * Hz + h;
  auto term = [&](int k) {
    const float y = activate(to_float(e[static_cast<int64_t>(k) * H]) + p, activation);
    return to_float(dh[k * stride]) * activation_grad(y, activation);
  };
  d_predictor[p_index] += chained_sum(t_hi - t_lo, term);
}

// The tile [n0, n0 + rows) on the host: its first node's (b, t), the number of (b, t) rows it
// meets, its first sample and the number of (b, u) pairs of the samples it meets.
struct TileRows {
  int b0 = 0, t0 = 0;
  int64_t frame_rows = 0, label_pairs = 0;
};

TileRows tile_rows(int64_t n0, int64_t rows, const JointBackwardArgs& a, int B) {
  TileRows r;
  const int64_t* offsets = a.host_node_offsets;
  auto locate = [&](int64_t n, int* b, int* t) {
    // The sample holding node n: the last b with offsets[b] <= n and a non-empty lattice.
    int lo = 0, hi = B - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (offsets[mid] <= n) lo = mid; else hi = mid - 1;
    }
    *b = lo;
    *t = static_cast<int>((n - offsets[lo]) / (a.host_label_lengths[lo] + 1));
  };
  int b1, t1;
  locate(n0, &r.b0, &r.t0);
  locate(n0 + rows - 1, &b1, &t1);
  int64_t row_index0 = r.t0, row_index1 = t1, pairs = 0;
  for (int b = r.b0; b < b1; ++b) row_index1 += a.host_logit_lengths[b];
  for (int b = r.b0; b <= b1; ++b) pairs += a.host_label_lengths[b] + 1;
  r.frame_rows = row_index1 - row_index0 + 1;
  r.label_pairs = pairs;
  return r;
}

template <typename T>
__global__ void cast_kernel(const float* __restrict__ in, T* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_float<T>(in[i]);
  }
}

int grid_warps(int64_t rows) {
  return static_cast<int>(std::min<int64_t>((rows + kWarps - 1) / kWarps, 1 << 16));
}

#define RETURN_IF_ERROR(expr)          \
  do {                                 \
    const Status _status = (expr);     \
    if (!_status.ok()) return _status; \
  } while (0)

// Carves the workspace into the buffers of one pass (with a null base it only counts bytes).
// Tiled mode: z (later d hidden) and logits (later d logits) in the input dtype T. Untiled mode:
// the kept tensors (joint values in T, logits in float32) plus, backward, d hidden and (half
// inputs) d logits in T for all nodes.
template <typename T>
struct JointBuffers {
  T* kernel = nullptr;        // [Hk, Vp]
  float* bias = nullptr;      // [Vp], -inf padding
  T* tile_z = nullptr;        // tiled: [tile, Hz]
  T* tile_logits = nullptr;   // tiled: [tile, Vp]
  float* d_kernel = nullptr;  // backward: [Hz, Vp] accumulator, d bias in row H
  T* d_hidden = nullptr;      // untiled backward: [N, Hz]
  T* d_logits = nullptr;      // untiled backward, half inputs: [N, Vp]
  size_t bytes = 0;

  JointBuffers(void* base, size_t tile, size_t Hk, size_t Hz, size_t Vp, bool backward,
               bool untiled) {
    char* origin = static_cast<char*>(base);
    auto take = [&](auto*& ptr, size_t count) {
      using P = typename std::remove_reference<decltype(*ptr)>::type;
      ptr = origin ? reinterpret_cast<P*>(origin + bytes) : nullptr;
      bytes += align_up(sizeof(P) * count);
    };
    take(kernel, Hk * Vp);
    take(bias, Vp);
    if (!untiled) {
      take(tile_z, tile * Hz);
      take(tile_logits, tile * Vp);
    }
    if (backward) {
      take(d_kernel, Hz * Vp);
      if (untiled) {
        take(d_hidden, tile * Hz);
        if (sizeof(T) != sizeof(float)) take(d_logits, tile * Vp);
      }
    }
  }
};

// L: the logits' dtype (T in tiled mode, float32 when untiled mode keeps them).
template <typename T, typename L>
Status forward(const JointShape& s, const JointForwardArgs& a, cudaStream_t stream) {
  const int H = s.H, V = s.V, Vp = joint_logits_width(s, true);
  const int Hz = joint_hidden_width(s, true), Hk = round_up_to_8(H);
  RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(
      a.lattice, 0, sizeof(float) * 2 * static_cast<size_t>(s.B) * s.T * s.U1, stream)));
  if (a.num_nodes == 0) return Status();
  cublasHandle_t handle;
  RETURN_IF_ERROR(cublas_handle_for(stream, &handle));
  const bool untiled = a.saved_logits != nullptr;
  const int64_t tile = untiled ? a.num_nodes : a.tile_nodes;
  const JointBuffers<T> buf(a.workspace, tile, Hk, Hz, Vp, false, untiled);
  padded_kernel_kernel<T><<<blocks_for(static_cast<int64_t>(Hk) * Vp, 256), 256, 0, stream>>>(
      static_cast<const T*>(a.kernel), H, V, Hk, Vp, buf.kernel);
  padded_bias_kernel<T><<<blocks_for(Vp, 256), 256, 0, stream>>>(static_cast<const T*>(a.bias), V,
                                                                  Vp, buf.bias);
  for (int64_t n0 = 0; n0 < a.num_nodes; n0 += tile) {
    const int64_t rows = std::min(tile, a.num_nodes - n0);
    T* z = untiled ? static_cast<T*>(a.saved_hidden) : buf.tile_z;
    L* logits = untiled ? reinterpret_cast<L*>(a.saved_logits) : reinterpret_cast<L*>(buf.tile_logits);
    hidden_kernel<T><<<grid_warps(rows), 32 * kWarps, 0, stream>>>(
        n0, rows, static_cast<const T*>(a.encoder), static_cast<const T*>(a.predictor),
        a.node_offsets, a.label_lengths, s.B, s.T, s.U1, H, Hz, s.activation, z);
    RETURN_IF_ERROR(gemm_row_major(handle, false, false, static_cast<int>(rows), Vp, Hk, z,
                                   cuda_type<T>(), Hz, buf.kernel, cuda_type<T>(), Vp, 0.f, logits,
                                   cuda_type<L>(), Vp, s.allow_tf32));
    picks_kernel<L><<<grid_warps(rows), 32 * kWarps, 0, stream>>>(
        n0, rows, logits, buf.bias, a.labels, a.node_offsets, a.label_lengths, s.B, s.T, s.U1, Vp,
        s.blank, a.lattice, a.lse);
    RETURN_IF_ERROR(last_launch_status());
  }
  return Status();
}

template <typename T, typename L>
Status backward(const JointShape& s, const JointBackwardArgs& a, cudaStream_t stream) {
  const int H = s.H, V = s.V, Vp = joint_logits_width(s, true);
  const int Hz = joint_hidden_width(s, true), Hk = round_up_to_8(H);
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
  const int64_t tile = untiled ? a.num_nodes : a.tile_nodes;
  const JointBuffers<T> buf(a.workspace, tile, Hk, Hz, Vp, true, untiled);
  const T* encoder = static_cast<const T*>(a.encoder);
  const T* predictor = static_cast<const T*>(a.predictor);
  padded_kernel_kernel<T><<<blocks_for(static_cast<int64_t>(Hk) * Vp, 256), 256, 0, stream>>>(
      static_cast<const T*>(a.kernel), H, V, Hk, Vp, buf.kernel);
  padded_bias_kernel<T><<<blocks_for(Vp, 256), 256, 0, stream>>>(static_cast<const T*>(a.bias), V,
                                                                  Vp, buf.bias);
  RETURN_IF_ERROR(cuda_status(
      cudaMemsetAsync(buf.d_kernel, 0, sizeof(float) * static_cast<size_t>(Hz) * Vp, stream)));
  const int h_threads = H >= 128 ? 128 : ((H + 31) / 32) * 32;
  const int h_slices = (H + h_threads - 1) / h_threads;
  for (int64_t n0 = 0; n0 < a.num_nodes; n0 += tile) {
    const int64_t rows = std::min(tile, a.num_nodes - n0);
    const T* z;
    L* logits;
    if (untiled) {
      z = static_cast<const T*>(a.saved_hidden);
      logits = reinterpret_cast<L*>(a.saved_logits);
    } else {  // recompute the tile (activation checkpointing)
      hidden_kernel<T><<<grid_warps(rows), 32 * kWarps, 0, stream>>>(
          n0, rows, encoder, predictor, a.node_offsets, a.label_lengths, s.B, s.T, s.U1, H, Hz,
          s.activation, buf.tile_z);
      logits = reinterpret_cast<L*>(buf.tile_logits);
      RETURN_IF_ERROR(gemm_row_major(handle, false, false, static_cast<int>(rows), Vp, Hk,
                                     buf.tile_z, cuda_type<T>(), Hz, buf.kernel, cuda_type<T>(),
                                     Vp, 0.f, logits, cuda_type<L>(), Vp, s.allow_tf32));
      z = buf.tile_z;
    }
    // d logits over the logits when they share a dtype.
    T* d_logits = sizeof(L) == sizeof(T) ? reinterpret_cast<T*>(logits) : buf.d_logits;
    logit_grads_kernel<L, T><<<grid_warps(rows), 32 * kWarps, 0, stream>>>(
        n0, rows, logits, buf.bias, a.labels, a.node_offsets, a.label_lengths, s.B, s.T, s.U1, V,
        Vp, s.blank, a.lse, a.d_lattice, d_logits);
    // [d kernel; d bias] += [z, 1]^T @ d logits (ordered over tiles).
    RETURN_IF_ERROR(gemm_row_major(handle, true, false, Hz, Vp, static_cast<int>(rows), z,
                                   cuda_type<T>(), Hz, d_logits, cuda_type<T>(), Vp, 1.f,
                                   buf.d_kernel, CUDA_R_32F, Vp, s.allow_tf32));
    // d hidden = d logits @ Kp^T, over z's buffer in tiled mode (z is not needed any more).
    T* d_hidden = untiled ? buf.d_hidden : buf.tile_z;
    RETURN_IF_ERROR(gemm_row_major(handle, false, true, static_cast<int>(rows), Hk, Vp, d_logits,
                                   cuda_type<T>(), Vp, buf.kernel, cuda_type<T>(), Vp, 0.f,
                                   d_hidden, cuda_type<T>(), Hz, s.allow_tf32));
    const TileRows tr = tile_rows(n0, rows, a, s.B);
    encoder_grad_kernel<T><<<dim3(static_cast<unsigned>(tr.frame_rows), h_slices), h_threads, 0,
                             stream>>>(n0, rows, tr.b0, tr.t0, d_hidden, encoder, predictor,
                                       a.node_offsets, a.logit_lengths, a.label_lengths, s.T, s.U1,
                                       H, Hz, s.activation, a.d_encoder);
    predictor_grad_kernel<T><<<dim3(static_cast<unsigned>(tr.label_pairs), h_slices), h_threads, 0,
                               stream>>>(n0, rows, tr.b0, d_hidden, encoder, predictor,
                                         a.node_offsets, a.logit_lengths, a.label_lengths, s.T,
                                         s.U1, H, Hz, s.activation, a.d_predictor);
    RETURN_IF_ERROR(last_launch_status());
  }
  unpad_grad_kernel<<<blocks_for(static_cast<int64_t>(H + 1) * V, 256), 256, 0, stream>>>(
      buf.d_kernel, H, V, Vp, a.d_kernel, a.d_bias);
  return last_launch_status();
}

}  // namespace

size_t joint_workspace_bytes_cuda(const JointShape& s, int64_t tile_nodes, bool backward,
                                  bool untiled) {
  size_t bytes = 0;
  const size_t Hz = joint_hidden_width(s, true), Hk = round_up_to_8(s.H);
  const size_t Vp = joint_logits_width(s, true);
  dispatch_dtype_cuda(s.dtype, [&](auto tag) {
    bytes = JointBuffers<decltype(tag)>(nullptr, static_cast<size_t>(tile_nodes), Hk, Hz, Vp,
                                        backward, untiled).bytes;
  });
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
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype_cuda(shape.dtype, [&](auto tag) {
    using T = decltype(tag);
    status = args.saved_logits != nullptr ? forward<T, float>(shape, args, s)
                                          : forward<T, T>(shape, args, s);
  });
  return status;
}

Status joint_backward_cuda(const JointShape& shape, const JointBackwardArgs& args,
                           GpuStream stream) {
  Status status;
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype_cuda(shape.dtype, [&](auto tag) {
    using T = decltype(tag);
    status = args.saved_logits != nullptr ? backward<T, float>(shape, args, s)
                                          : backward<T, T>(shape, args, s);
  });
  return status;
}

}  // namespace tf_rnnt
