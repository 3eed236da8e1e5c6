// The device code of the fused joint tile kernels (joint_fused_sm90.cu) that is not tied to the
// wgmma pipeline: the operand layouts, the per-row state, the forming of Z and the epilogues on
// the accumulators, and the launchers' declarations.
//
// Layouts. Z (the block's joint values) and each 16 KB image of the prepared output layer are
// K-major with the 128-byte swizzle: 16-byte chunk c of 128-byte row r stored at chunk
// c ^ (r mod 8), K blocks of 64 values kRows rows apart (Z) or one image per (chunk, K block) step
// (the kernel). wgmma leaves a warp's [16, 8 j] accumulators in the mma.sync
// fragment layout: element 4 j + 2 half + e of a thread is row (half ? row0 + 8 : row0),
// column 8 j + 2 (lane mod 4) + e, row0 = 16 warp + lane / 4; the epilogues work on that.
#ifndef TF_RNNT_JOINT_FUSED_TILE_CUH_
#define TF_RNNT_JOINT_FUSED_TILE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tf_rnnt/dtype_cuda.cuh"
#include "tf_rnnt/node_math.h"
#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {
namespace fused {
namespace detail {

constexpr int kChunk = 128;                      // vocabulary columns per accumulator chunk
constexpr int kKBlock = 64;                      // K elements per 128-byte swizzled row
constexpr int kRowBytes = 128;                   // one swizzled row: kKBlock 16-bit values
constexpr int kStageBytes = kChunk * kRowBytes;  // one image: 16 KB
constexpr int kMaxH = 640;

__host__ __device__ __forceinline__ int round_up(int n, int m) { return (n + m - 1) / m * m; }

// The wgmma width (8, 16, 32, 64 or 128) that covers a chunk of `columns` vocabulary columns.
__host__ __device__ __forceinline__ int mma_width(int columns) {
  int n = 8;
  while (n < columns && n < kChunk) n *= 2;
  return n;
}

// Byte offset of 16-byte chunk c of row r in a 128-byte-swizzled tile.
__device__ __forceinline__ uint32_t swizzled(int r, int c) {
  return static_cast<uint32_t>(r * kRowBytes + ((c ^ (r & 7)) << 4));
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <typename T>
struct Params {
  const T* encoder;
  const T* predictor;
  const T* kernel_t;  // the stage images: step c * (Hk / 64) + kb at kStageBytes * step
  const float* bias;  // [Vw], -inf padding
  const int32_t* labels;
  const int64_t* offsets;
  const int32_t* label_lengths;
  int B, T_max, U1, H, Hk, V, blank;
  Activation activation;
  int64_t n0, rows;
  float* lattice;  // forward
  float* lse;      // forward: out; recompute: in
  const float* d_lattice;
  T* z_out;  // recompute, kept forward: [rows, z_width]
  int z_width;
  T* d_logits;    // recompute: [rows, logits_width]
  T* logits_out;  // kept forward: [rows, logits_width], the logits without bias
  int logits_width;
  int tail_width;    // recompute: tail_columns, or 0
  float* tail_sums;  // recompute: [blocks, tail_width, H + 1], added to
};

// One row of the block, as a thread of its quad sees it.
struct RowInfo {
  bool valid;
  int label;  // -1 at u = U_b
  int64_t node, padded;
  float g_blank, g_label, lse;
};

// Row r of the block from its node's encoder and predictor rows (node_rows): b = pred_row / U1,
// no search. The loads but g_label's are independent, so the row costs two memory latencies
// before the block's first chunk, not a chain of them.
template <typename T, bool kRecompute>
__device__ __forceinline__ RowInfo row_info(const Params<T>& p, int64_t block_row0, int r,
                                            const int32_t* enc_row, const int32_t* pred_row) {
  RowInfo info{};
  info.label = -1;
  const int q = pred_row[r];
  // (The same test either way, node_rows' -1 past the tile or the row count; these forms gave
  // the kernels the fewest register spills.)
  info.valid = kRecompute ? q >= 0 : block_row0 + r < p.rows;
  if (!info.valid) return info;
  info.node = p.n0 + block_row0 + r;
  const int b = q / p.U1, u = q - b * p.U1, t = enc_row[r] - b * p.T_max, U = p.U1 - 1;
  info.padded = (static_cast<int64_t>(b) * p.T_max + t) * p.U1 + u;
  const int label_length = p.label_lengths[b];
  const int label = u < U ? p.labels[static_cast<int64_t>(b) * U + u] : -1;
  if (kRecompute) {
    info.g_blank = p.d_lattice[2 * info.padded];
    info.lse = p.lse[info.node];
  }
  if (u < label_length) info.label = label;
  if (kRecompute) info.g_label = info.label >= 0 ? p.d_lattice[2 * info.padded + 1] : 0.f;
  return info;
}

// The per-thread state of the epilogue: the two rows' log-sum-exp and picks.
struct RowState {
  LseState lse[2];
  float blank[2], label[2];
};

// x * log2(e) - m * log2(e) in one FFMA, then the hardware exp2: exp(x - m), a few ulp.
__device__ __forceinline__ float exp_shifted(float x, float m_log2e) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(fmaf(x, 1.4426950408889634f, -m_log2e)));
  return y;
}

// Two float32 values rounded to T and packed in one 32-bit word, and back.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  struct alignas(4) Pair {
    T v[2];
  } pair{{from_float<T>(a), from_float<T>(b)}};
  return *reinterpret_cast<const uint32_t*>(&pair);
}
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t w) {
  const T* v = reinterpret_cast<const T*>(&w);
  return make_float2(to_float(v[0]), to_float(v[1]));
}

// The value of register array x at run-time index i (a select chain: no local memory).
template <int n>
__device__ __forceinline__ uint32_t select(const uint32_t (&x)[n], int i) {
  uint32_t v = x[0];
#pragma unroll
  for (int k = 1; k < n; ++k) v = i == k ? x[k] : v;
  return v;
}

// The recompute's epilogue of a chunk: its accumulators rounded to T and packed (Pending), then
// worked through in four parts of 4 blocks of 8 columns.
constexpr int kBlocks = kChunk / 8;  // blocks of 8 columns in a chunk
static_assert(kBlocks == 16, "four parts of four blocks");

// A thread's share of a chunk's logits: word [half][j] holds row (half ? row0 + 8 : row0),
// columns c0 + 8 j + 2 (lane mod 4) + {0, 1}, rounded to T (the cuBLAS path's logits tile and a
// mixed-precision Dense layer round there too).
struct Pending {
  uint32_t w[2][kBlocks];
  int c0 = 0, blocks = 0;
};

// A warp's accumulators of a [16, nw] chunk (the fragment layout above), rounded and packed.
template <typename T, int nw>
__device__ __forceinline__ void capture(const float (&acc)[kChunk / 2], int c0, Pending* pend) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int j = 0; j < nw / 8; ++j) {
      pend->w[half][j] = pack2<T>(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
    }
  }
  pend->c0 = c0;
  pend->blocks = nw / 8;
}

// A register array reduced pairwise (it is overwritten): a dependency chain of log2(n) steps
// where a running reduction has n. The epilogue is latency bound: this is what keeps it short.
template <int n, typename Op>
__device__ __forceinline__ float tree_reduce(float (&x)[n], Op op) {
  static_assert((n & (n - 1)) == 0, "a power of two");
  if constexpr (n == 1) {
    return x[0];
  } else {
    float y[n / 2];
#pragma unroll
    for (int k = 0; k < n / 2; ++k) y[k] = op(x[k], x[k + n / 2]);
    return tree_reduce(y, op);
  }
}

// Column of value k of a thread's row share (lane_col: the thread's first column).
__device__ __forceinline__ int share_col(int lane_col, int k) {
  return lane_col + 8 * (k / 2) + k % 2;
}

// The forward epilogue of chunk [c0, c0 + nw): logits rounded to T plus bias, then per row the
// online log-sum-exp with one rescale per chunk (lse_push_block, node_math.h, with exp_shifted),
// and the blank/label picks in the chunk that holds their columns.
template <typename T, int nw>
__device__ __forceinline__ void forward_epilogue(const Params<T>& p, const float (&acc)[kChunk / 2],
                                                 const float (&bias)[kChunk / 4], int c0, int lane,
                                                 const RowInfo (&rows)[2], RowState* st) {
  constexpr int n = nw / 4;  // values per row and thread
  const int lane_col = c0 + 2 * (lane & 3);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float x[n], scratch[n];
#pragma unroll
    for (int k = 0; k < n; ++k) {
      x[k] = to_float(from_float<T>(acc[4 * (k / 2) + 2 * half + k % 2])) + bias[k];
      scratch[k] = x[k];
    }
    LseState& s = st->lse[half];
    const float m =
        fmaxf(s.max, tree_reduce(scratch, [](float a, float b) { return fmaxf(a, b); }));
    if (m == INFINITY) {  // the exact special case of lse_push_block, unrolled (no local memory)
#pragma unroll
      for (int k = 0; k < n; ++k) s = lse_push(s, x[k]);
    } else if (m != kNegInf) {  // m = -inf: every value so far is -inf, the state stays
      const float m_log2e = m * 1.4426950408889634f;
#pragma unroll
      for (int k = 0; k < n; ++k) scratch[k] = exp_shifted(x[k], m_log2e);
      const float sum = tree_reduce(scratch, [](float a, float b) { return a + b; });
      s.sum = (s.max == kNegInf ? 0.f : s.sum * exp_shifted(s.max, m_log2e)) + sum;
      s.max = m;
    }
    if (p.blank >= c0 && p.blank < c0 + nw) {
#pragma unroll
      for (int k = 0; k < n; ++k) {
        if (share_col(lane_col, k) == p.blank) st->blank[half] = x[k];
      }
    }
    const int label = rows[half].label;
    if (label >= c0 && label < c0 + nw) {
#pragma unroll
      for (int k = 0; k < n; ++k) {
        if (share_col(lane_col, k) == label) st->label[half] = x[k];
      }
    }
  }
}

// The kept forward's logits of a warp's [16, nw] chunk at c0 (untiled mode keeps them for the
// backward): rounded to T, without bias, stored as the recompute stores d logits: a whole chunk's
// pairs as the fragment holds them (stored_column, joint_fused.h), in 16-byte accesses; a tail
// chunk's in column order.
template <typename T, int nw, bool kTail>
__device__ __forceinline__ void keep_logits(const Params<T>& p, const float (&acc)[kChunk / 2],
                                            int c0, int lane, const RowInfo (&rows)[2],
                                            int64_t block_row0, int row0) {
  const int quad_lane = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (!rows[half].valid) continue;
    T* out = p.logits_out + (block_row0 + row0 + 8 * half) * p.logits_width;
    if constexpr (!kTail) {
      static_assert(nw % 32 == 0, "whole chunks store 32 columns a part");
#pragma unroll
      for (int part = 0; part < nw / 32; ++part) {
        uint32_t w[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int k = 4 * (4 * part + j) + 2 * half;
          w[j] = pack2<T>(acc[k], acc[k + 1]);
        }
        *reinterpret_cast<uint4*>(out + c0 + 32 * part + 8 * quad_lane) =
            make_uint4(w[0], w[1], w[2], w[3]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < nw / 8; ++j) {
        const int col = c0 + 8 * j + 2 * quad_lane;
        if (col < p.logits_width) {
          *reinterpret_cast<uint32_t*>(out + col) =
              pack2<T>(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
        }
      }
    }
  }
}

// Part `part` of the pending chunk (blocks 4 part .. 4 part + 3; those past pend.blocks are
// masked) in the recompute: d logits = g_blank (1[v = blank] - p_v) + g_label (1[v = label] - p_v)
// (logit_grad, node_math.h, with exp_shifted), the indicator terms added only in the part that
// holds their column, columns past V zeroed only in the tail chunk (kTail). Each lane stores its
// four pairs in one 16-byte access: of a whole chunk as they are (stored_column, joint_fused.h),
// of the tail chunk, in column order, after the quad swaps them.
template <typename T, bool kTail, int part>
__device__ __forceinline__ void recompute_part(const Params<T>& p, const Pending& pend,
                                               const float (&bias)[kChunk / 4], int lane,
                                               const RowInfo (&rows)[2], int64_t block_row0,
                                               int row0, uint32_t (&tail_words)[2][4]) {
  constexpr int j0 = 4 * part;
  if (j0 >= pend.blocks) return;  // uniform over the block
  const int quad_lane = lane & 3, lane_col = pend.c0 + 8 * j0 + quad_lane * 2;
  const int first_col = pend.c0 + 8 * j0;  // the part's columns: [first_col, first_col + 32)
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const RowInfo& r = rows[half];
    // Every lane takes part (the shuffles); invalid rows have zero gradients, not stored.
    const float lse_log2e = r.lse * 1.4426950408889634f, g_sum = r.g_blank + r.g_label;
    const bool live = r.g_blank != 0.f || r.g_label != 0.f;
    float g[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // blocks past the chunk hold no values: -inf
      const float2 v =
          j0 + j < pend.blocks ? unpack2<T>(pend.w[half][j0 + j]) : make_float2(kNegInf, kNegInf);
      g[2 * j] = -exp_shifted(v.x + bias[8 * part + 2 * j], lse_log2e) * g_sum;
      g[2 * j + 1] = -exp_shifted(v.y + bias[8 * part + 2 * j + 1], lse_log2e) * g_sum;
    }
    if (p.blank >= first_col && p.blank < first_col + 32) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (share_col(lane_col, k) == p.blank) g[k] += r.g_blank;
      }
    }
    if (r.label >= first_col && r.label < first_col + 32) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (share_col(lane_col, k) == r.label) g[k] += r.g_label;
      }
    }
    if (kTail) {
#pragma unroll
      for (int k = 0; k < 8; ++k) g[k] = share_col(lane_col, k) < p.V ? g[k] : 0.f;
    }
    uint32_t group[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) group[j] = live ? pack2<T>(g[2 * j], g[2 * j + 1]) : 0u;
    if (!kTail) {  // a whole chunk: the pairs as the fragment holds them (stored_column)
      if (r.valid) {
        T* out = p.d_logits + (block_row0 + row0 + 8 * half) * p.logits_width;
        *reinterpret_cast<uint4*>(out + first_col + 8 * quad_lane) =
            make_uint4(group[0], group[1], group[2], group[3]);
      }
      continue;
    }
    // Lane q of the quad gathers block j0 + q: word k of it from lane k.
    uint32_t u[4];
    const uint32_t own = select(group, quad_lane);
#pragma unroll
    for (int k = 0; k < 4; ++k) u[k] = own;
#pragma unroll
    for (int k = 1; k < 4; ++k) {
      const uint32_t recv = __shfl_xor_sync(0xffffffffu, select(group, quad_lane ^ k), k);
#pragma unroll
      for (int q = 0; q < 4; ++q) u[q] = q == (quad_lane ^ k) ? recv : u[q];
    }
    const int col = first_col + 8 * quad_lane;
    if (kTail && part == 0) {  // lane 0 of the quad: the chunk's first 8 columns (tail_sums)
#pragma unroll
      for (int k = 0; k < 4; ++k) tail_words[half][k] = u[k];
    }
    if (r.valid && col < p.logits_width) {
      T* out = p.d_logits + (block_row0 + row0 + 8 * half) * p.logits_width;
      *reinterpret_cast<uint4*>(out + col) = make_uint4(u[0], u[1], u[2], u[3]);
    }
  }
}

// Z = act(encoder[b, t] + predictor[b, u]) for the block's kRows rows, into the swizzled tile
// (and with kStoreZ into p.z_out):
// thread tid of kThreads takes 16-byte chunk tid mod 8 of every (kThreads / 8)-th 128-byte line
// (K block, row), so
// no index needs a division, with kBatch chunks' loads in flight (the predictor rows come from
// L2); the activation is a template argument, out of the per-element code.
template <typename T, bool kStoreZ, Activation act, int kRows, int kThreads>
__device__ __forceinline__ void form_z(const Params<T>& p, uint8_t* z_tile, const int32_t* enc_row,
                                       const int32_t* pred_row, int64_t block_row0, int kblocks) {
  constexpr int kBatch = 8, kLineStep = kThreads / 8;
  const int lines = kblocks * kRows, chunk = threadIdx.x & 7;
  for (int l0 = threadIdx.x >> 3; l0 < lines; l0 += kLineStep * kBatch) {
    uint4 e_bits[kBatch], p_bits[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int l = l0 + k * kLineStep, r = l % kRows, h = (l / kRows) * kKBlock + 8 * chunk;
      e_bits[k] = p_bits[k] = make_uint4(0, 0, 0, 0);
      if (l < lines && enc_row[r] >= 0 && h < p.H) {
        e_bits[k] =
            *reinterpret_cast<const uint4*>(p.encoder + static_cast<int64_t>(enc_row[r]) * p.H + h);
        p_bits[k] = *reinterpret_cast<const uint4*>(p.predictor +
                                                    static_cast<int64_t>(pred_row[r]) * p.H + h);
      }
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int l = l0 + k * kLineStep, r = l % kRows, h = (l / kRows) * kKBlock + 8 * chunk;
      if (l >= lines) break;
      uint4 bits = make_uint4(0, 0, 0, 0);
      if (enc_row[r] >= 0 && h < p.H) {
        const T* ev = reinterpret_cast<const T*>(&e_bits[k]);
        const T* pv = reinterpret_cast<const T*>(&p_bits[k]);
        T* zv = reinterpret_cast<T*>(&bits);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          zv[i] = from_float<T>(tile_activate<T>(to_float(ev[i]) + to_float(pv[i]), act));
        }
        if (kStoreZ) {
          *reinterpret_cast<uint4*>(p.z_out + (block_row0 + r) * p.z_width + h) = bits;
        }
      }
      *reinterpret_cast<uint4*>(z_tile + l * kRowBytes + ((chunk ^ (r & 7)) << 4)) = bits;
    }
  }
}

// Per row of the block: the encoder row b T_max + t and the predictor row b U1 + u of its node
// (-1 past the tile), by threads [0, kRows).
template <typename T, int kRows>
__device__ __forceinline__ void node_rows(const Params<T>& p, int64_t block_row0, int32_t* enc_row,
                                          int32_t* pred_row) {
  const int tid = threadIdx.x;
  if (tid >= kRows) return;
  int e = -1, q = -1;
  if (block_row0 + tid < p.rows) {
    const NodeIndex i = locate_node(p.n0 + block_row0 + tid, p.offsets, p.B, p.label_lengths);
    e = i.b * p.T_max + i.t;
    q = i.b * p.U1 + i.u;
  }
  enc_row[tid] = e;
  pred_row[tid] = q;
}

// Z for the block (form_z with the activation as a template argument) and, with kStoreZ, each
// valid row's ones column (its d kernel row is d bias) and zeros up to p.z_out's width.
template <typename T, bool kStoreZ, int kRows, int kThreads>
__device__ __forceinline__ void form_block_z(const Params<T>& p, uint8_t* z_tile,
                                             const int32_t* enc_row, const int32_t* pred_row,
                                             int64_t block_row0, int kblocks) {
  switch (p.activation) {
    case Activation::kTanh:
      form_z<T, kStoreZ, Activation::kTanh, kRows, kThreads>(p, z_tile, enc_row, pred_row,
                                                             block_row0, kblocks);
      break;
    case Activation::kRelu:
      form_z<T, kStoreZ, Activation::kRelu, kRows, kThreads>(p, z_tile, enc_row, pred_row,
                                                             block_row0, kblocks);
      break;
    default:
      form_z<T, kStoreZ, Activation::kIdentity, kRows, kThreads>(p, z_tile, enc_row, pred_row,
                                                                 block_row0, kblocks);
  }
  const int tid = threadIdx.x;
  if (kStoreZ && tid < kRows && block_row0 + tid < p.rows) {
    T* z = p.z_out + (block_row0 + tid) * p.z_width;
    for (int h = p.H; h < p.z_width; ++h) z[h] = from_float<T>(h == p.H ? 1.f : 0.f);
  }
}

__device__ __forceinline__ void init_row_state(RowState* st) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st->lse[h] = lse_init();
    st->blank[h] = st->label[h] = 0.f;
  }
}

// The forward's per-row results of a warp once every chunk is done: the quad's four partial rows
// merged in a fixed order, and the picks from the lanes that hold their columns (every lane of the
// quad gets them).
template <typename T>
__device__ __forceinline__ RowState merge_quad(const Params<T>& p, const RowState& st,
                                               const RowInfo (&rows)[2], int lane) {
  RowState m;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    LseState s = st.lse[h];
#pragma unroll
    for (int offset = 1; offset < 4; offset <<= 1) {
      LseState o;
      o.max = __shfl_xor_sync(0xffffffffu, s.max, offset);
      o.sum = __shfl_xor_sync(0xffffffffu, s.sum, offset);
      s = lse_merge(s, o);
    }
    m.lse[h] = s;
    const int quad = lane & ~3;
    m.blank[h] = __shfl_sync(0xffffffffu, st.blank[h], quad | ((p.blank & 7) >> 1));
    const int label = rows[h].label >= 0 ? rows[h].label : 0;
    m.label[h] = __shfl_sync(0xffffffffu, st.label[h], quad | ((label & 7) >> 1));
  }
  return m;
}

// A tile kernel over p.rows nodes, rows_per_block a block, with `bytes` of dynamic shared memory.
template <typename Kernel, typename T>
Status launch_tile_kernel(Kernel kernel, const Params<T>& p, int rows_per_block, int threads,
                          size_t bytes, cudaStream_t stream) {
  Status st =
      cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  if (!st.ok()) return st;
  const int64_t blocks = (p.rows + rows_per_block - 1) / rows_per_block;
  kernel<<<static_cast<unsigned>(blocks), threads, bytes, stream>>>(p);
  return last_launch_status();
}

// The kernels' launcher (p filled in but for nothing shape-dependent it owns): forward (kRecompute
// false; keeping Z and the logits where p.logits_out is set) or recompute over p.rows nodes; the
// shared memory a block takes; nodes per block (one block an SM). They need sm_90a code
// (TF_RNNT_FUSED_SM90A).
template <typename T, bool kRecompute>
Status launch_wgmma(const JointShape& s, Params<T> p, cudaStream_t stream);
size_t wgmma_smem_bytes(const JointShape& s);
constexpr int kWgmmaRows = 128;

}  // namespace detail
}  // namespace fused
}  // namespace tf_rnnt

#endif  // TF_RNNT_JOINT_FUSED_TILE_CUH_
