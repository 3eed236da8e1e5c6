// The cuBLAS path's kernels of the CUDA joint (joint_cuda.cu, which alone includes this file:
// its definitions are the translation unit's own) and the layout helpers they share with the
// workspace plan (joint_workspace.cuh).
#ifndef TF_RNNT_JOINT_CUBLAS_KERNELS_CUH_
#define TF_RNNT_JOINT_CUBLAS_KERNELS_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "cublas_loader.h"
#include "joint_fused.h"
#include "joint_grads.h"
#include "tf_rnnt/dtype_cuda.cuh"
#include "tf_rnnt/node_math.h"
#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {
namespace {  // NOLINT: one translation unit

constexpr int kWarps = 8;  // warps per block in the per-node kernels

template <typename T>
cudaDataType_t cuda_type();
template <>
cudaDataType_t cuda_type<float>() {
  return CUDA_R_32F;
}
template <>
cudaDataType_t cuda_type<__half>() {
  return CUDA_R_16F;
}
template <>
cudaDataType_t cuda_type<__nv_bfloat16>() {
  return CUDA_R_16BF;
}

size_t align_up(size_t bytes) { return (bytes + 255) & ~size_t(255); }

// Row widths of the tile buffers and of the untiled mode's kept tensors: the joint values get a
// ones column (through the d kernel GEMM it yields d bias), and both widths are padded to
// multiples of 8 for aligned tensor-core GEMMs.
int round_up_to_8(int n) { return (n + 7) / 8 * 8; }
int hidden_width(const JointShape& s) { return round_up_to_8(s.H + 1); }
int logits_width(const JointShape& s) { return round_up_to_8(s.V); }

__global__ void node_offsets_kernel(const int32_t* logit_lengths, const int32_t* label_lengths,
                                    int B, int64_t* offsets) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    offsets[0] = 0;
    for (int b = 0; b < B; ++b) {
      offsets[b + 1] = offsets[b] + static_cast<int64_t>(logit_lengths[b]) * (label_lengths[b] + 1);
    }
  }
}

// Kp [Hk, Vp] = [[kernel, 0], [0, 0]] (the zero padding keeps every GEMM operand 16-byte
// aligned), or with `transposed` Kp^T [Vp, Hk] for the logits GEMM: both of its operands are
// then K-major, the one layout Hopper's tensor cores take TF32 operands in, and cuBLAS runs it
// faster in every dtype (docs/design.md).
// `permuted` > 0: its columns below `permuted` in the fused recompute's d logits order
// (fused::stored_column).
template <typename T>
__global__ void padded_kernel_kernel(const T* __restrict__ kernel, int H, int V, int Hk, int Vp,
                                     bool transposed, int permuted, T* __restrict__ out) {
  const int64_t total = static_cast<int64_t>(Hk) * Vp;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int h = static_cast<int>(transposed ? i % Hk : i / Vp);
    const int v = fused::stored_column(static_cast<int>(transposed ? i / Hk : i % Vp), permuted);
    out[i] = (v < V && h < H) ? kernel[static_cast<int64_t>(h) * V + v] : from_float<T>(0.f);
  }
}

// bias as float32 [Vp], -inf in the padding columns (they then drop out of the log-sum-exp);
// columns below `permuted` in the fused kernels' order (fused::stored_column).
template <typename T>
__global__ void padded_bias_kernel(const T* __restrict__ bias, int V, int Vp, int permuted,
                                   float* __restrict__ out) {
  for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < Vp; v += gridDim.x * blockDim.x) {
    out[v] = v < V ? to_float(bias[fused::stored_column(v, permuted)]) : kNegInf;
  }
}

// n values of type P moved as one vector access.
template <typename P, int n>
struct alignas(sizeof(P) * n) Pack {
  P x[n];
};

// The fused recompute's d kernel / d bias sums of the vocabulary's tail columns [V0, V0 + width),
// [slots, width, H + 1], added to the padded accumulator in a fixed order. Block (x, j): 32 of
// the H + 1 entries of column j, each summed over the slots by kTailLanes threads and then in
// order.
constexpr int kTailLanes = 32;
__global__ void tail_grad_kernel(const float* __restrict__ sums, int64_t slots, int width, int H,
                                 int V0, int Vp, float* __restrict__ padded) {
  __shared__ float part[kTailLanes][32];
  const int col = threadIdx.x & 31, lane = threadIdx.x >> 5;
  const int h = blockIdx.x * 32 + col, j = blockIdx.y;
  float sum = 0.f;
  if (h <= H) {
    for (int64_t k = lane; k < slots; k += kTailLanes) sum += sums[(k * width + j) * (H + 1) + h];
  }
  part[lane][col] = sum;
  __syncthreads();
  if (lane == 0 && h <= H) {
    float total = 0.f;
#pragma unroll
    for (int l = 0; l < kTailLanes; ++l) total += part[l][col];
    padded[static_cast<int64_t>(h) * Vp + V0 + j] += total;
  }
}

// d kernel (rows < H) and d bias (row H) out of the padded accumulator, whose columns below
// `permuted` are in the fused recompute's d logits order (fused::stored_column).
__global__ void unpad_grad_kernel(const float* __restrict__ padded, int H, int V, int Vp,
                                  int permuted, float* __restrict__ d_kernel,
                                  float* __restrict__ d_bias) {
  const int64_t total = static_cast<int64_t>(H + 1) * V;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int h = static_cast<int>(i / V), v = static_cast<int>(i % V);
    const float g = padded[static_cast<int64_t>(h) * Vp + fused::stored_column(v, permuted)];
    if (h < H)
      d_kernel[i] = g;
    else
      d_bias[v] = g;
  }
}

// z[n - n0] = (act(encoder[b, t] + predictor[b, u]), 1, 0...): a warp per node, 16-byte loads
// and stores when H allows them.
template <typename T>
__global__ void hidden_kernel(int64_t n0, int64_t rows, const T* __restrict__ encoder,
                              const T* __restrict__ predictor, const int64_t* __restrict__ offsets,
                              const int32_t* __restrict__ label_lengths, int B, int T_max, int U1,
                              int H, int Hz, Activation activation, T* __restrict__ z) {
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
          ov[k] = from_float<T>(tile_activate<T>(to_float(ev[k]) + to_float(pv[k]), activation));
        }
        *reinterpret_cast<uint4*>(out + h) = out_bits;
      }
    } else {
      for (int h = lane; h < H; h += 32) {
        out[h] = from_float<T>(tile_activate<T>(to_float(e[h]) + to_float(p[h]), activation));
      }
    }
    for (int h = H + lane; h < Hz; h += 32) out[h] = from_float<T>(h == H ? 1.f : 0.f);
  }
}

// The same joint values transposed, z^T [Hz, ld] (column r: node n0 + r; columns rows .. ld - 1
// zero), for the backward's recompute: the d kernel GEMM then reads z K-major, which Hopper's
// tensor cores need for TF32 and cuBLAS runs faster for 16-bit types too, and the logits GEMM
// reads it transposed at little cost. For 16-bit types a thread per node: it reads 16 bytes of its
// encoder and predictor rows at a time (the rest of each sector stays in L1 for its next read),
// and a warp's 32 consecutive nodes make each of its stores one coalesced run of a z^T row. For
// float32, whose 16 bytes hold half as many values, hidden_t_shared_kernel is faster
// (docs/design.md).
constexpr int kTransposeThreads = 256;
template <typename T>
__global__ void __launch_bounds__(kTransposeThreads)
    hidden_t_kernel(int64_t n0, int64_t rows, const T* __restrict__ encoder,
                    const T* __restrict__ predictor, const int64_t* __restrict__ offsets,
                    const int32_t* __restrict__ label_lengths, int B, int T_max, int U1, int H,
                    int Hz, Activation activation, int64_t ld, T* __restrict__ z_t) {
  constexpr int kPack = 16 / sizeof(T);
  const int64_t r = blockIdx.x * static_cast<int64_t>(kTransposeThreads) + threadIdx.x;
  if (r >= ld) return;
  const T* e = nullptr;
  const T* p = nullptr;
  if (r < rows) {
    const NodeIndex i = locate_node(n0 + r, offsets, B, label_lengths);
    e = encoder + (static_cast<int64_t>(i.b) * T_max + i.t) * H;
    p = predictor + (static_cast<int64_t>(i.b) * U1 + i.u) * H;
  }
  T* out = z_t + r;
  const auto put = [&](int h, float v) { out[h * ld] = from_float<T>(v); };
  int h0 = 0;
  if (H % kPack == 0) {  // rows 16-byte aligned
    for (; h0 < H; h0 += kPack) {
      uint4 e_bits = make_uint4(0, 0, 0, 0), p_bits = e_bits;
      if (e) {
        e_bits = *reinterpret_cast<const uint4*>(e + h0);
        p_bits = *reinterpret_cast<const uint4*>(p + h0);
      }
      const T* ev = reinterpret_cast<const T*>(&e_bits);
      const T* pv = reinterpret_cast<const T*>(&p_bits);
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        put(h0 + k, e ? tile_activate<T>(to_float(ev[k]) + to_float(pv[k]), activation) : 0.f);
      }
    }
  }
  for (int h = h0; h < H; ++h) {
    put(h, e ? tile_activate<T>(to_float(e[h]) + to_float(p[h]), activation) : 0.f);
  }
  for (int h = H; h < Hz; ++h) put(h, e && h == H ? 1.f : 0.f);
}

// hidden_t_kernel for float32: block (32, 8) takes 32 nodes, located once, through all Hz rows
// 32 at a time via shared memory (double-buffered: one barrier a step), so that both the reads
// (along H) and the writes (along the nodes) are coalesced; each step's loads are issued before
// the previous step's stores.
constexpr int kTransposeTile = 32, kTransposeRows = 8;
template <typename T>
__global__ void __launch_bounds__(kTransposeTile* kTransposeRows)
    hidden_t_shared_kernel(int64_t n0, int64_t rows, const T* __restrict__ encoder,
                           const T* __restrict__ predictor, const int64_t* __restrict__ offsets,
                           const int32_t* __restrict__ label_lengths, int B, int T_max, int U1,
                           int H, int Hz, Activation activation, int64_t ld, T* __restrict__ z_t) {
  constexpr int kPerThread = kTransposeTile / kTransposeRows;
  __shared__ float tile[2][kTransposeTile][kTransposeTile + 1];
  __shared__ int64_t enc_row[kTransposeTile], pred_row[kTransposeTile];  // -1 past the tile
  const int x = threadIdx.x, y = threadIdx.y;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTransposeTile;
  if (y == 0) {
    int64_t e = -1, q = -1;
    if (r0 + x < rows) {
      const NodeIndex i = locate_node(n0 + r0 + x, offsets, B, label_lengths);
      e = (static_cast<int64_t>(i.b) * T_max + i.t) * H;
      q = (static_cast<int64_t>(i.b) * U1 + i.u) * H;
    }
    enc_row[x] = e;
    pred_row[x] = q;
  }
  __syncthreads();
  // Row i = y + k kTransposeRows of the step's tile: node r0 + i, column h0 + x of z.
  T e_val[kPerThread], p_val[kPerThread];
  const auto load = [&](int h0) {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int i = y + k * kTransposeRows, h = h0 + x;
      e_val[k] = p_val[k] = from_float<T>(0.f);
      if (enc_row[i] >= 0 && h < H) {
        e_val[k] = encoder[enc_row[i] + h];
        p_val[k] = predictor[pred_row[i] + h];
      }
    }
  };
  load(0);
  const bool column_in = r0 + x < ld;
  for (int h0 = 0, step = 0; h0 < Hz; h0 += kTransposeTile, ++step) {
    float (*t)[kTransposeTile + 1] = tile[step & 1];
    const int h = h0 + x;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int i = y + k * kTransposeRows;
      float v = 0.f;
      if (enc_row[i] >= 0 && h < H) {
        v = tile_activate<T>(to_float(e_val[k]) + to_float(p_val[k]), activation);
      } else if (enc_row[i] >= 0 && h == H) {
        v = 1.f;
      }
      t[i][x] = v;
    }
    __syncthreads();
    if (h0 + kTransposeTile < Hz) load(h0 + kTransposeTile);
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int i = y + k * kTransposeRows;
      if (column_in && h0 + i < Hz) z_t[(h0 + i) * ld + r0 + x] = from_float<T>(t[x][i]);
    }
  }
}

// Log-sum-exp of a TDT joint's D duration columns [Vt, Vt + D) of a row, in every lane.
template <typename L>
__device__ __forceinline__ LseState durations_lse(const L* row, const float* bias, int Vt, int D) {
  LseState s = lse_init();
  for (int j = 0; j < D; ++j) s = lse_push(s, to_float(row[Vt + j]) + bias[Vt + j]);
  return s;
}

// The forward's per-node statistics, one warp a node (each lane reads 16 bytes of the row at a
// time: rows are Vp wide, a multiple of 8, so every pack is aligned): the log-sum-exp over the Vt
// token columns (lse), the blank and label log-probabilities, and a TDT joint's D duration
// log-probabilities (lattice channels 2 .. 2 + D of C).
template <typename L>
__global__ void picks_kernel(int64_t n0, int64_t rows, const L* __restrict__ logits,
                             const float* __restrict__ bias, const int32_t* __restrict__ labels,
                             const int64_t* __restrict__ offsets,
                             const int32_t* __restrict__ label_lengths, int B, int T_max, int U1,
                             int Vp, int Vt, int D, int blank, float* __restrict__ lattice,
                             float* __restrict__ lse) {
  constexpr int kPack = 16 / sizeof(L);
  const int lane = threadIdx.x & 31;
  const int C = 2 + D;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + (threadIdx.x >> 5); r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const L* row = logits + r * Vp;
    LseState s = lse_init();
    for (int v = lane * kPack; v < Vp; v += 32 * kPack) {
      const Pack<L, kPack> packed = *reinterpret_cast<const Pack<L, kPack>*>(row + v);
      float x[kPack];
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        x[k] = v + k < Vt ? to_float(packed.x[k]) + bias[v + k] : kNegInf;
      }
      s = lse_push_block(s, x);
    }
    s = warp_lse(s);
    const int64_t n = n0 + r;
    const NodeIndex i = locate_node(n, offsets, B, label_lengths);
    float* node = lattice + C * ((static_cast<int64_t>(i.b) * T_max + i.t) * U1 + i.u);
    if (lane == 0) {
      lse[n] = lse_value(s);
      node[0] = log_softmax_at(to_float(row[blank]) + bias[blank], s);
      if (i.u < label_lengths[i.b]) {
        const int label = labels[static_cast<int64_t>(i.b) * (U1 - 1) + i.u];
        node[1] = log_softmax_at(to_float(row[label]) + bias[label], s);
      }
    }
    if (D > 0) {
      const LseState dur = durations_lse(row, bias, Vt, D);
      for (int j = lane; j < D; j += 32) {
        node[2 + j] = log_softmax_at(to_float(row[Vt + j]) + bias[Vt + j], dur);
      }
    }
  }
}

// d logits from the per-node lattice gradients (may write over the logits, pack by pack);
// zeros in the padding columns so the GEMMs that read d logits see no garbage. Columns below
// `permuted` are in the fused kernels' order (fused::stored_column), and so is bias: only the
// blank's and the label's places move (the columns below `permuted` are all below V). Packs
// wholly past V are not read (the fused forward leaves them unwritten). A TDT joint's duration
// columns [Vt, V) (never permuted) take duration_logit_grad.
template <typename L, typename T>
__global__ void logit_grads_kernel(int64_t n0, int64_t rows, const L* logits,
                                   const float* __restrict__ bias,
                                   const int32_t* __restrict__ labels,
                                   const int64_t* __restrict__ offsets,
                                   const int32_t* __restrict__ label_lengths, int B, int T_max,
                                   int U1, int V, int Vp, int Vt, int permuted, int blank,
                                   const float* __restrict__ lse,
                                   const float* __restrict__ d_lattice, T* d_logits) {
  constexpr int kPack = 16 / sizeof(L);
  const int lane = threadIdx.x & 31;
  const int D = V - Vt, C = 2 + D;
  const int blank_at = fused::stored_column(blank, permuted);
  for (int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + (threadIdx.x >> 5); r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t n = n0 + r;
    const NodeIndex i = locate_node(n, offsets, B, label_lengths);
    const float* g = d_lattice + C * ((static_cast<int64_t>(i.b) * T_max + i.t) * U1 + i.u);
    const bool has_label = i.u < label_lengths[i.b];
    const int label_at =
        has_label
            ? fused::stored_column(labels[static_cast<int64_t>(i.b) * (U1 - 1) + i.u], permuted)
            : -1;
    const float g_blank = g[0];
    const float g_label = has_label ? g[1] : 0.f;
    const float total = lse[n];
    const L* row = logits + r * Vp;
    T* out = d_logits + r * Vp;
    float dur_lse = 0.f, g_sum = 0.f;
    if (D > 0) {
      dur_lse = lse_value(durations_lse(row, bias, Vt, D));
      for (int j = 0; j < D; ++j) g_sum += g[2 + j];
      __syncwarp();  // every lane has read the duration logits before any is overwritten
    }
    for (int v = lane * kPack; v < Vp; v += 32 * kPack) {
      Pack<L, kPack> packed{};
      if (v < V) packed = *reinterpret_cast<const Pack<L, kPack>*>(row + v);
      Pack<T, kPack> grads;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const int c = v + k;
        const float x = to_float(packed.x[k]) + (c < V ? bias[c] : 0.f);
        const float d = c < Vt  ? logit_grad(x, total, c, blank_at, label_at, g_blank, g_label)
                        : c < V ? duration_logit_grad(x, dur_lse, g[2 + c - Vt], g_sum)
                                : 0.f;
        grads.x[k] = from_float<T>(d);
      }
      *reinterpret_cast<Pack<T, kPack>*>(out + v) = grads;
    }
  }
}

// Frames are grouped in chunks of kChunkRows (aligned to t = 0) for the d encoder / d predictor
// reductions: d predictor is summed over a chunk's frames in one block, then over chunks.
// With 16 the float32 partial sums move an eighth of the bytes of the 16-bit d hidden they sum.
constexpr int kChunkRows = 16;
constexpr int kGradWarps = 8;  // warps per block of hidden_grads_kernel; warp w takes u = w mod 8

// The tile's span: first node (b0, t0), last node (b1, t1).
struct TileSpan {
  int b0 = 0, t0 = 0, b1 = 0, t1 = 0;
};

// The frames [first, last] of sample b that meet the tile (last < first: none).
struct FrameRange {
  int first, last;
};

__host__ __device__ __forceinline__ FrameRange tile_frames(int b, const TileSpan& span,
                                                           int logit_length) {
  return {b == span.b0 ? span.t0 : 0, b == span.b1 ? span.t1 : logit_length - 1};
}

// Chunks of sample b that meet the tile (0 for an empty sample).
__host__ __device__ __forceinline__ int tile_chunks(int b, const TileSpan& span, int logit_length) {
  const FrameRange f = tile_frames(b, span, logit_length);
  return f.last < f.first ? 0 : f.last / kChunkRows - f.first / kChunkRows + 1;
}

// Floats of the d predictor partial sums of one tile: a [chunks of b, U_b + 1, H] block per sample
// b that meets it. At most H * (tile / kChunkRows + (B + 6) * (U + 1)): a sample inside the tile
// adds at most one chunk beyond T_b / kChunkRows, the two edge samples at most 3 (U_b + 1) rows.
size_t pred_partial_floats(const JointShape& s, size_t tile) {
  return static_cast<size_t>(s.H) *
         ((tile + kChunkRows - 1) / kChunkRows + static_cast<size_t>(s.B + 6) * s.U1);
}

// The chunk (sample b, its k-th chunk in the tile) of block x, and where its partial block
// starts (in rows of H), counted over the samples from b0.
struct ChunkRef {
  int b, k;
  int64_t partial_row;
};

__device__ __forceinline__ ChunkRef find_chunk(int x, const TileSpan& span,
                                               const int32_t* logit_lengths,
                                               const int32_t* label_lengths) {
  ChunkRef c{span.b0, x, 0};
  for (;;) {
    const int n = tile_chunks(c.b, span, logit_lengths[c.b]);
    if (c.k < n) break;
    c.k -= n;
    c.partial_row += static_cast<int64_t>(n) * (label_lengths[c.b] + 1);
    ++c.b;
  }
  c.partial_row += static_cast<int64_t>(c.k) * (label_lengths[c.b] + 1);
  return c;
}

// g = d hidden * act'(enc + pred) for the tile's nodes of one chunk (<= kChunkRows frames of
// sample b, all u), with the activation recomputed from the inputs. Sums, in a fixed order (no
// atomics: deterministic):
//   d encoder[b, t] += sum_u g(t, u)                    (complete for the tile: block-local)
//   partial[chunk, u] = sum over the chunk's frames of g  (predictor_grad_kernel adds them up)
// Block: kGradWarps warps x 32 lanes; lane l takes kVec adjacent h, warp w the u = w mod
// kGradWarps; blockIdx.y picks the H slice of 32 * kVec columns. The kernel is bound by memory
// latency: the encoder values and each warp's d encoder sums live in shared memory, so that few
// registers a thread (64) let four blocks share an SM.
template <typename T, int kVec>
__global__ void __launch_bounds__(32 * kGradWarps, 4)
    hidden_grads_kernel(int64_t n0, int64_t rows, TileSpan span, const T* __restrict__ d_hidden,
                        const T* __restrict__ encoder, const T* __restrict__ predictor,
                        const int64_t* __restrict__ offsets,
                        const int32_t* __restrict__ logit_lengths,
                        const int32_t* __restrict__ label_lengths, int T_max, int U1, int H, int Hz,
                        Activation activation, float* __restrict__ d_encoder,
                        float* __restrict__ partials) {
  constexpr int R = kChunkRows;
  using Vec = Pack<T, kVec>;  // kVec adjacent columns in one access (h and H are multiples)
  using Acc = Pack<float, kVec>;
  __shared__ Acc encoder_sums[kGradWarps][R][32];
  __shared__ Acc enc[R][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int h = (blockIdx.y * 32 + lane) * kVec;
  const bool active = h < H;
  const ChunkRef c = find_chunk(blockIdx.x, span, logit_lengths, label_lengths);
  const int b = c.b, U1_b = label_lengths[b] + 1;
  const FrameRange f = tile_frames(b, span, logit_lengths[b]);
  const int t_a = (f.first / R + c.k) * R;
  const int r_lo = max(f.first - t_a, 0), r_hi = min(f.last - t_a + 1, R);
  // Tile-relative node of (t_a, u = 0).
  const int64_t rel0 = offsets[b] + static_cast<int64_t>(t_a) * U1_b - n0;

  for (int r = warp; r < R; r += kGradWarps) {
    Vec v{};
    if (active && r >= r_lo && r < r_hi) {
      v = *reinterpret_cast<const Vec*>(encoder + (static_cast<int64_t>(b) * T_max + t_a + r) * H +
                                        h);
    }
    Acc a;
#pragma unroll
    for (int j = 0; j < kVec; ++j) a.x[j] = to_float(v.x[j]);
    enc[r][lane] = a;
  }
#pragma unroll
  for (int r = 0; r < R; ++r) encoder_sums[warp][r][lane] = Acc{};
  __syncthreads();

  // The chunk's d hidden rows of u into dh (rows outside the tile: not loaded, zero).
  // Row r of u is tile row rel0 + u + r U1_b: in the tile for r in [lo, hi).
  const int stride = U1_b * Hz;
  auto load = [&](int u, Vec(&dh)[R], Vec& pv) {
    pv = *reinterpret_cast<const Vec*>(predictor + (static_cast<int64_t>(b) * U1 + u) * H + h);
    const int64_t base = rel0 + u;
    const int lo = base >= 0 ? r_lo : max(r_lo, static_cast<int>((U1_b - 1 - base) / U1_b));
    const int hi = rows - base <= 0
                       ? 0
                       : static_cast<int>(std::min<int64_t>(r_hi, (rows - base + U1_b - 1) / U1_b));
    const T* row = d_hidden + base * Hz + h;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      dh[r] = Vec{};
      if (r >= lo && r < hi) dh[r] = *reinterpret_cast<const Vec*>(row + r * stride);
    }
  };
  auto work = [&](int u, const Vec(&dh)[R], const Vec& pv) {
    float acc_p[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc_p[j] = 0.f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const Acc e = enc[r][lane];
      Acc s = encoder_sums[warp][r][lane];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float y = tile_activate<T>(e.x[j] + to_float(pv.x[j]), activation);
        const float g = to_float(dh[r].x[j]) * activation_grad(y, activation);
        s.x[j] += g;
        acc_p[j] += g;
      }
      encoder_sums[warp][r][lane] = s;
    }
    Acc out;
#pragma unroll
    for (int j = 0; j < kVec; ++j) out.x[j] = acc_p[j];
    *reinterpret_cast<Acc*>(partials + (c.partial_row + u) * H + h) = out;
  };
  if (active) {
    for (int u = warp; u < U1_b; u += kGradWarps) {
      Vec dh[R], pv;
      load(u, dh, pv);
      work(u, dh, pv);
    }
  }
  // d encoder: the warps' sums added in warp order.
  __syncthreads();
  for (int i = threadIdx.x; i < R * 32; i += 32 * kGradWarps) {
    const int r = i / 32, l = i % 32;
    const int hc = (blockIdx.y * 32 + l) * kVec;
    if (r < r_lo || r >= r_hi || hc >= H) continue;
    Acc sum{};
#pragma unroll
    for (int w = 0; w < kGradWarps; ++w) {
      const Acc part = encoder_sums[w][r][l];
#pragma unroll
      for (int j = 0; j < kVec; ++j) sum.x[j] += part.x[j];
    }
    float* out = d_encoder + (static_cast<int64_t>(b) * T_max + t_a + r) * H + hc;
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[j] += sum.x[j];
  }
}

// d predictor[b, u] += the tile's partial sums of (b, u), over its chunks in order.
// Block x: the x-th (b, u) pair counted from (b0, 0); blockIdx.y splits H.
__global__ void predictor_grad_kernel(TileSpan span, const float* __restrict__ partials,
                                      const int32_t* __restrict__ logit_lengths,
                                      const int32_t* __restrict__ label_lengths, int U1, int H,
                                      float* __restrict__ d_predictor) {
  const int h = blockIdx.y * blockDim.x + threadIdx.x;
  if (h >= H) return;
  int b = span.b0, u = static_cast<int>(blockIdx.x);
  int64_t partial_row = 0;
  while (u > label_lengths[b]) {
    u -= label_lengths[b] + 1;
    partial_row +=
        static_cast<int64_t>(tile_chunks(b, span, logit_lengths[b])) * (label_lengths[b] + 1);
    ++b;
  }
  const int U1_b = label_lengths[b] + 1;
  const int chunks = tile_chunks(b, span, logit_lengths[b]);
  const float* in = partials + (partial_row + u) * H + h;
  float sum = 0.f;
  for (int k = 0; k < chunks; ++k) sum += in[static_cast<int64_t>(k) * U1_b * H];
  d_predictor[(static_cast<int64_t>(b) * U1 + u) * H + h] += sum;
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

}  // namespace
}  // namespace tf_rnnt

#endif  // TF_RNNT_JOINT_CUBLAS_KERNELS_CUH_
