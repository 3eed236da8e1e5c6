// Fused joint tile kernels for Hopper (sm_90a): joint_fused.h says what they compute.
//
// A block takes kRows = 128 consecutive packed nodes: two consumer warpgroups of 64 rows each and
// a producer warpgroup, one thread of which issues the copies.
//   1. Z = act(encoder[b, t] + predictor[b, u]) for its rows, formed once in shared memory by all
//      threads (while the producer's first copies land) in the wgmma K-major layout with the
//      128-byte swizzle (16-byte chunk c of row r stored at chunk c ^ (r mod 8)), H padded with
//      zeros to a multiple of 64;
//   2. the vocabulary in chunks of 128 columns: logits = Z @ kernel[:, chunk] by wgmma, A (Z) and
//      B from shared memory, float32 accumulators in registers. B is the output layer prepared
//      as one 16 KB image per (chunk, K block) step, already swizzled, which the producer
//      streams through kStages buffers with bulk copies (cp.async.bulk); "full" and "empty"
//      mbarriers per buffer pace it, so the warpgroups need no block-wide barrier and one can
//      run its epilogue while the other's wgmmas run;
//   3. an epilogue per chunk on the accumulators: the logits rounded to the input dtype (as the
//      cuBLAS path's logits tile and a mixed-precision Dense layer), plus bias, then
//        forward:   the online log-sum-exp (Milakov & Gimelshein 2018), one rescale per chunk
//                   and pairwise reductions (the epilogue is latency bound), and the picks,
//        recompute: d logits = g_blank (1[v = blank] - p_v) + g_label (1[v = label] - p_v);
//   4. recompute, when the vocabulary ends in a chunk of at most 8 columns (tail_columns): that
//      chunk's d kernel and d bias columns, [Z, 1]^T d logits over the block's rows, from Z in
//      shared memory, so that the backward's d kernel GEMM covers whole chunks only.
// Each row's reductions run in a fixed order (no atomics): results are deterministic.
#include "joint_fused.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "tf_rnnt/dtype_cuda.cuh"
#include "tf_rnnt/node_math.h"
#include "wgmma_sm90.cuh"

namespace tf_rnnt {
namespace fused {

namespace {

constexpr int kRows = 128;                  // nodes per block
constexpr int kChunk = 128;                 // vocabulary columns per accumulator chunk
constexpr int kKBlock = 64;                 // K elements per 128-byte swizzled row
constexpr int kRowBytes = 128;              // one swizzled row: kKBlock 16-bit values
constexpr int kStages = 4;                  // kernel buffers in flight
constexpr int kConsumers = 256;             // two warpgroups
constexpr int kThreads = kConsumers + 128;  // and the producer's warpgroup
// Registers per thread once the producer gave its share to the consumers (setmaxnreg):
// 128 x 40 + 256 x 232 of the 64 K an SM has.
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
constexpr int kStageBytes = kChunk * kRowBytes;  // 16 KB
constexpr int kMaxH = 640;                       // Z of 128 x 640 16-bit values: 160 KB
constexpr int kTableBytes = 2 * kRows * 4;       // the rows' encoder and predictor indices
constexpr int kBarrierBytes = 2 * kStages * 8;   // the full and empty mbarriers
constexpr int kAlign = 1024;                     // the swizzle pattern repeats every 1024 B

__host__ __device__ __forceinline__ int round_up(int n, int m) { return (n + m - 1) / m * m; }
// The wgmma width (8, 16, 32, 64 or 128) that covers a chunk of `columns` vocabulary columns.
__host__ __device__ __forceinline__ int mma_width(int columns) {
  int n = 8;
  while (n < columns && n < kChunk) n *= 2;
  return n;
}
int k_extent(const JointShape& s) { return round_up(s.H, kKBlock); }
int vocab_extent(const JointShape& s) { return round_up(s.V, kChunk); }

size_t smem_bytes(const JointShape& s) {
  return static_cast<size_t>(k_extent(s)) * kRows * 2 + kStages * kStageBytes + kTableBytes +
         kBarrierBytes + kAlign;
}

// Byte offset of 16-byte chunk c of row r in a 128-byte-swizzled tile.
__device__ __forceinline__ uint32_t swizzled(int r, int c) {
  return static_cast<uint32_t>(r * kRowBytes + ((c ^ (r & 7)) << 4));
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): K-major, 128-byte
// swizzle, 8-row groups 1024 bytes apart (stride byte offset); the leading byte offset is unused
// for this layout.
__device__ __forceinline__ uint64_t matrix_descriptor(uint32_t address) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// mbarriers (PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier").
__device__ __forceinline__ void mbarrier_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar)
               : "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Returns once the barrier's phase of the given parity has completed. (The retry loop stays inside
// the asm: written as a C++ loop, it made ptxas serialize the wgmmas in flight across it.)
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n"
      "wait:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra wait;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// bytes from global to shared memory by the bulk copy engine, completing on mbarrier bar.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// Generic-proxy writes to shared memory made visible to the tensor cores.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int n>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(n) : "memory");
}
// Keeps the compiler from moving accumulator accesses across the asynchronous wgmma.
template <int n>
__device__ __forceinline__ void fence_registers(float (&d)[n]) {
#pragma unroll
  for (int i = 0; i < n; ++i) asm volatile("" : "+f"(d[i])::"memory");
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
  T* z_out;
  int z_width;
  T* d_logits;
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

template <typename T, bool kRecompute>
__device__ __forceinline__ RowInfo row_info(const Params<T>& p, int64_t row) {
  RowInfo r{};
  r.valid = row < p.rows;
  r.label = -1;
  if (!r.valid) return r;
  r.node = p.n0 + row;
  const NodeIndex i = locate_node(r.node, p.offsets, p.B, p.label_lengths);
  r.padded = (static_cast<int64_t>(i.b) * p.T_max + i.t) * p.U1 + i.u;
  if (i.u < p.label_lengths[i.b]) r.label = p.labels[static_cast<int64_t>(i.b) * (p.U1 - 1) + i.u];
  if (kRecompute) {
    r.g_blank = p.d_lattice[2 * r.padded];
    r.g_label = r.label >= 0 ? p.d_lattice[2 * r.padded + 1] : 0.f;
    r.lse = p.lse[r.node];
  }
  return r;
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

// The wgmma accumulator fragment of a [64, nw] chunk: element 4 j + 2 half + e of a thread is
// row (half ? row0 + 8 : row0), column 8 j + 2 (lane mod 4) + e.
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

// Part `part` of the pending chunk (blocks 4 part .. 4 part + 3; those past pend.blocks are
// masked) in the recompute: d logits = g_blank (1[v = blank] - p_v) + g_label (1[v = label] - p_v)
// (logit_grad, node_math.h, with exp_shifted), the indicator terms added only in the part that
// holds their column, columns past V zeroed only in the tail chunk (kTail). Each lane stores 8
// columns in one 16-byte access after the quad swaps its pairs.
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

// The block's mainloop state: where the operands and the kernel buffers' mbarriers are.
struct Pipeline {
  uint32_t a_address;       // this warpgroup's 64 rows of Z
  uint32_t stages_address;  // the kStages kernel buffers
  uint32_t full, empty;     // the buffers' mbarriers, 8 bytes apart
  int kblocks;              // K blocks of 64
};

// One vocabulary chunk c of nw columns: per K block, wait until its buffer is full, four k16
// wgmmas, and once the step before's wgmmas are done, release that step's buffer; then the
// chunk's epilogue.
template <typename T, bool kRecompute, int nw, bool kTail>
__device__ __forceinline__ void run_chunk(const Params<T>& p, const Pipeline& pipe, int c,
                                          float (&acc)[kChunk / 2], int lane,
                                          const RowInfo (&rows)[2], int64_t block_row0, int row0,
                                          RowState* st, Pending* pend,
                                          uint32_t (&tail_words)[2][4]) {
  // The chunk's bias for the thread's columns (-inf past the chunk's width), loaded while the
  // wgmmas run.
  float bias[kChunk / 4];
#pragma unroll
  for (int j = 0; j < kChunk / 8; ++j) {
    const float2 b =
        j < nw / 8
            ? __ldg(reinterpret_cast<const float2*>(p.bias + c * kChunk + 2 * (lane & 3) + 8 * j))
            : make_float2(kNegInf, kNegInf);
    bias[2 * j] = b.x;
    bias[2 * j + 1] = b.y;
  }
  const int step0 = c * pipe.kblocks;
  for (int kb = 0; kb < pipe.kblocks; ++kb) {
    const int step = step0 + kb, stage = step % kStages;
    mbarrier_wait(pipe.full + 8 * stage, (step / kStages) & 1);
    const uint32_t a_base = pipe.a_address + kb * (kRows * kRowBytes);
    const uint32_t b_base = pipe.stages_address + stage * kStageBytes;
    fence_registers(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKBlock / 16; ++kk) {
      wgmma::Mma<T, nw>::run(acc, matrix_descriptor(a_base + 32 * kk),
                             matrix_descriptor(b_base + 32 * kk), kb == 0 && kk == 0 ? 0 : 1);
    }
    wgmma_commit();
    wgmma_wait<1>();
    fence_registers(acc);
    if (kb > 0 && lane == 0) mbarrier_arrive(pipe.empty + 8 * ((step - 1) % kStages));
  }
  wgmma_wait<0>();
  fence_registers(acc);
  if (lane == 0) mbarrier_arrive(pipe.empty + 8 * ((step0 + pipe.kblocks - 1) % kStages));
  if (!kRecompute) {
    forward_epilogue<T, nw>(p, acc, bias, c * kChunk, lane, rows, st);
  } else {
    capture<T, nw>(acc, c * kChunk, pend);
    recompute_part<T, kTail, 0>(p, *pend, bias, lane, rows, block_row0, row0, tail_words);
    recompute_part<T, kTail, 1>(p, *pend, bias, lane, rows, block_row0, row0, tail_words);
    recompute_part<T, kTail, 2>(p, *pend, bias, lane, rows, block_row0, row0, tail_words);
    recompute_part<T, kTail, 3>(p, *pend, bias, lane, rows, block_row0, row0, tail_words);
  }
}

// Z = act(encoder[b, t] + predictor[b, u]) for the block's rows, into the swizzled tile: thread
// tid takes 16-byte chunk tid mod 8 of every (kThreads / 8)-th 128-byte line (K block, row), so
// no index needs a division, with kBatch chunks' loads in flight (the predictor rows come from
// L2); the activation is a template argument, out of the per-element code.
template <typename T, bool kRecompute, Activation act>
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
        if (kRecompute) {
          *reinterpret_cast<uint4*>(p.z_out + (block_row0 + r) * p.z_width + h) = bits;
        }
      }
      *reinterpret_cast<uint4*>(z_tile + l * kRowBytes + ((chunk ^ (r & 7)) << 4)) = bits;
    }
  }
}

// Step 4 splits the block's rows into tail_groups(H) groups (rows g, g + groups, ...) of H / 8
// threads, each thread a 16-byte chunk of Z's rows: at most kTailThreads of the consumers; the
// next kWidth threads sum the d bias columns.
constexpr int kTailThreads = 240;
__host__ __device__ __forceinline__ int tail_groups(int H) {
  const int groups = kTailThreads / (H / 8);
  return groups < kRows ? groups : kRows;
}

// Step 4: tail_sums[block, j, h] += sum over the block's rows r of Z[r, h] d logits[r, V0 + j]
// (Z[r, H] = 1: d bias), V0 the tail chunk's first column; per group in row order, then over the
// groups in order. tail_words: the quad's lane 0 holds its two rows' d logits of columns
// V0 .. V0 + 7 (rounded to T, as the GEMMs read them). The stage buffers, idle once both
// warpgroups' wgmmas are done, hold them and the groups' sums (2 KB + at most 1928 x 8 floats).
template <typename T, int kWidth>
__device__ __forceinline__ void sum_tail_columns(const Params<T>& p,
                                                 const uint32_t (&tail_words)[2][4], int lane,
                                                 int row0, const uint8_t* z_tile, uint8_t* stages) {
  T* const d_tail = reinterpret_cast<T*>(stages);  // [kRows][8]
  float* const group_sums = reinterpret_cast<float*>(stages + kRows * 8 * sizeof(T));
  const int tid = threadIdx.x, H1 = p.H + 1, entries = kWidth * H1;
  const int chunks = p.H / 8, groups = tail_groups(p.H);
  float* const bias_sums = group_sums + groups * kWidth * p.H;
  // This thread's entries of the block's slot: their old values load while the sums are formed.
  constexpr int kPerThread = (kWidth * (kMaxH + 1) + kConsumers - 1) / kConsumers;
  float* const slot = p.tail_sums + static_cast<int64_t>(blockIdx.x) * entries;
  float old[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int e = tid + i * kConsumers;
    old[i] = e < entries ? slot[e] : 0.f;
  }
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory");
  if ((lane & 3) == 0) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      *reinterpret_cast<uint4*>(d_tail + (row0 + 8 * half) * 8) = make_uint4(
          tail_words[half][0], tail_words[half][1], tail_words[half][2], tail_words[half][3]);
    }
  }
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory");
  if (tid < groups * chunks) {
    const int g = tid / chunks, k = tid % chunks;
    // Chunk k of a row: 16-byte chunk k mod 8 of K block k / 8.
    const uint8_t* column = z_tile + (k / 8) * (kRows * kRowBytes);
    float sum[kWidth][8];
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
#pragma unroll
      for (int e = 0; e < 8; ++e) sum[j][e] = 0.f;
    }
#pragma unroll 4
    for (int r = g; r < kRows; r += groups) {
      const uint4 bits = *reinterpret_cast<const uint4*>(column + swizzled(r, k % 8));
      const T* z = reinterpret_cast<const T*>(&bits);
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        const float d = to_float(d_tail[r * 8 + j]);
#pragma unroll
        for (int e = 0; e < 8; ++e) sum[j][e] = fmaf(to_float(z[e]), d, sum[j][e]);
      }
    }
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      float4* out = reinterpret_cast<float4*>(group_sums + (g * kWidth + j) * p.H + 8 * k);
      out[0] = make_float4(sum[j][0], sum[j][1], sum[j][2], sum[j][3]);
      out[1] = make_float4(sum[j][4], sum[j][5], sum[j][6], sum[j][7]);
    }
  } else if (tid >= kTailThreads && tid < kTailThreads + kWidth) {
    const int j = tid - kTailThreads;
    float sum = 0.f;
    for (int r = 0; r < kRows; ++r) sum += to_float(d_tail[r * 8 + j]);
    bias_sums[j] = sum;
  }
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory");
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int e = tid + i * kConsumers;
    if (e >= entries) break;
    const int j = e / H1, h = e % H1;
    float sum = 0.f;
    if (h < p.H) {
      for (int g = 0; g < groups; ++g) sum += group_sums[(g * kWidth + j) * p.H + h];
    } else {
      sum = bias_sums[j];
    }
    slot[e] = old[i] + sum;
  }
}

template <typename T, bool kRecompute>
__global__ void __launch_bounds__(kThreads, 1) joint_tile_kernel(const Params<T> p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_address(smem_raw);
  uint8_t* const smem = smem_raw + (((raw + kAlign - 1) & ~uint32_t(kAlign - 1)) - raw);
  const int kblocks = p.Hk / kKBlock;
  uint8_t* const z_tile = smem;                                  // [kblocks][kRows][128 B]
  uint8_t* const stages = z_tile + kblocks * kRows * kRowBytes;  // [kStages][kChunk][128 B]
  int32_t* const enc_row = reinterpret_cast<int32_t*>(stages + kStages * kStageBytes);
  int32_t* const pred_row = enc_row + kRows;
  const uint32_t full = smem_address(pred_row + kRows), empty = full + 8 * kStages;

  const int tid = threadIdx.x, lane = tid & 31;
  const int64_t block_row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int chunks = (p.V + kChunk - 1) / kChunk, steps = chunks * kblocks;
  const uint32_t stages_address = smem_address(stages);

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full + 8 * s, 1);                 // the producer's arrival and the copy's bytes
      mbarrier_init(empty + 8 * s, kConsumers / 32);  // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if (tid < kRows) {
    int e = -1, q = -1;
    if (block_row0 + tid < p.rows) {
      const NodeIndex i = locate_node(p.n0 + block_row0 + tid, p.offsets, p.B, p.label_lengths);
      e = i.b * p.T_max + i.t;
      q = i.b * p.U1 + i.u;
    }
    enc_row[tid] = e;
    pred_row[tid] = q;
  }
  __syncthreads();

  // Step s's image into buffer s mod kStages; the first kStages need no release, so their copies
  // run while Z forms. Of a narrower last chunk only its rows are copied (a prefix of the image).
  const int tail = mma_width(p.V - (chunks - 1) * kChunk);  // the last chunk's wgmma width
  const auto issue = [&](int step) {
    const int stage = step % kStages;
    const uint32_t bytes = step / kblocks == chunks - 1 ? tail * kRowBytes : kStageBytes;
    mbarrier_arrive_expect_tx(full + 8 * stage, bytes);
    bulk_copy(stages_address + stage * kStageBytes,
              p.kernel_t + static_cast<int64_t>(step) * (kStageBytes / sizeof(T)), bytes,
              full + 8 * stage);
  };
  if (tid == kConsumers) {
    for (int step = 0; step < kStages && step < steps; ++step) issue(step);
  }

  // 1. Z in shared memory (and, recomputing, in the tile buffer for the backward GEMMs) by all
  // threads.
  switch (p.activation) {
    case Activation::kTanh:
      form_z<T, kRecompute, Activation::kTanh>(p, z_tile, enc_row, pred_row, block_row0, kblocks);
      break;
    case Activation::kRelu:
      form_z<T, kRecompute, Activation::kRelu>(p, z_tile, enc_row, pred_row, block_row0, kblocks);
      break;
    default:
      form_z<T, kRecompute, Activation::kIdentity>(p, z_tile, enc_row, pred_row, block_row0,
                                                   kblocks);
  }
  if (kRecompute && tid < kRows && block_row0 + tid < p.rows) {
    // The ones column (its d kernel row is d bias) and zeros up to the buffer's width.
    T* z = p.z_out + (block_row0 + tid) * p.z_width;
    for (int h = p.H; h < p.z_width; ++h) z[h] = from_float<T>(h == p.H ? 1.f : 0.f);
  }

  // Z visible to the tensor cores.
  fence_async_shared();
  __syncthreads();

  if (tid >= kConsumers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    // The producer: the other steps, each once the consumers released the step kStages before.
    if (tid == kConsumers) {
      for (int step = kStages; step < steps; ++step) {
        mbarrier_wait(empty + 8 * (step % kStages), (step / kStages - 1) & 1);
        issue(step);
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));

  // 2-3. The chunks.
  const int warpgroup = tid >> 7, warp = (tid >> 5) & 3;
  const int row0 = warpgroup * 64 + warp * 16 + (lane >> 2);
  const RowInfo rows[2] = {row_info<T, kRecompute>(p, block_row0 + row0),
                           row_info<T, kRecompute>(p, block_row0 + row0 + 8)};
  RowState st;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st.lse[h] = lse_init();
    st.blank[h] = st.label[h] = 0.f;
  }
  const int full_chunks = p.V / kChunk;
  const Pipeline pipe{smem_address(z_tile) + warpgroup * 64 * kRowBytes, stages_address, full,
                      empty, kblocks};
  float acc[kChunk / 2];
#pragma unroll
  for (int i = 0; i < kChunk / 2; ++i) acc[i] = 0.f;
  Pending pend;
  uint32_t tail_words[2][4] = {};
  for (int c = 0; c < chunks; ++c) {
#define TF_RNNT_RUN_CHUNK(nw, tail_chunk)                                                      \
  run_chunk<T, kRecompute, nw, tail_chunk>(p, pipe, c, acc, lane, rows, block_row0, row0, &st, \
                                           &pend, tail_words)
    if (c < full_chunks) {
      TF_RNNT_RUN_CHUNK(128, false);
    } else if (tail == 128) {
      TF_RNNT_RUN_CHUNK(128, true);
    } else if (tail == 64) {
      TF_RNNT_RUN_CHUNK(64, true);
    } else if (tail == 32) {
      TF_RNNT_RUN_CHUNK(32, true);
    } else if (tail == 16) {
      TF_RNNT_RUN_CHUNK(16, true);
    } else {
      TF_RNNT_RUN_CHUNK(8, true);
    }
#undef TF_RNNT_RUN_CHUNK
  }
  if (kRecompute && p.tail_width > 0) {
    switch (p.tail_width) {
#define TF_RNNT_TAIL_SUMS(n)                                           \
  case n:                                                              \
    sum_tail_columns<T, n>(p, tail_words, lane, row0, z_tile, stages); \
    break;
      TF_RNNT_TAIL_SUMS(1)
      TF_RNNT_TAIL_SUMS(2)
      TF_RNNT_TAIL_SUMS(3)
      TF_RNNT_TAIL_SUMS(4)
      TF_RNNT_TAIL_SUMS(5)
      TF_RNNT_TAIL_SUMS(6)
      TF_RNNT_TAIL_SUMS(7)
      TF_RNNT_TAIL_SUMS(8)
#undef TF_RNNT_TAIL_SUMS
    }
  }

  if (!kRecompute) {
    // The quad's four partial rows merged in a fixed order; the picks from the lanes that hold
    // their columns.
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
      const int quad = lane & ~3;
      const float blank = __shfl_sync(0xffffffffu, st.blank[h], quad | ((p.blank & 7) >> 1));
      const int label = rows[h].label >= 0 ? rows[h].label : 0;
      const float label_x = __shfl_sync(0xffffffffu, st.label[h], quad | ((label & 7) >> 1));
      const RowInfo& r = rows[h];
      if ((lane & 3) == 0 && r.valid) {
        p.lse[r.node] = lse_value(s);
        p.lattice[2 * r.padded] = log_softmax_at(blank, s);
        if (r.label >= 0) p.lattice[2 * r.padded + 1] = log_softmax_at(label_x, s);
      }
    }
  }
#endif
}

// kernel_t: for each step (chunk c, K block kb) the 16 KB image its buffer takes, rows
// v = c kChunk + r, 16-byte chunks swizzled as in Z, holding kernel[h, v] for
// h = kb kKBlock + 8 chunk + e, zeros outside [H, V]; bias [Vw] float32, -inf outside V.
template <typename T>
__global__ void prepare_kernel(const T* __restrict__ kernel, const T* __restrict__ bias, int H,
                               int V, int Hk, int Vw, T* __restrict__ kernel_t,
                               float* __restrict__ bias_out) {
  const int64_t total = static_cast<int64_t>(Vw) * Hk;
  const int kblocks = Hk / kKBlock;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int v = static_cast<int>(i / Hk), h = static_cast<int>(i % Hk);
    const int c = v / kChunk, r = v % kChunk, kb = h / kKBlock, e = h % 8;
    const int chunk = (h % kKBlock) / 8;
    const int64_t step = static_cast<int64_t>(c) * kblocks + kb;
    const int64_t at = step * (kStageBytes / 2) + swizzled(r, chunk) / 2 + e;
    kernel_t[at] = v < V && h < H ? kernel[static_cast<int64_t>(h) * V + v] : from_float<T>(0.f);
    if (h == 0) bias_out[v] = v < V ? to_float(bias[v]) : kNegInf;
  }
}

Status invalid(const char* message) {
  Status s;
  s.code = StatusCode::kInvalidArgument;
  s.message = message;
  return s;
}

template <typename T, bool kRecompute>
Status launch(const JointShape& s, const JointOptions& o, const Tile& tile, Params<T> p,
              cudaStream_t stream) {
  if (tile.rows == 0) return Status();
  p.encoder = static_cast<const T*>(tile.encoder);
  p.predictor = static_cast<const T*>(tile.predictor);
  p.kernel_t = static_cast<const T*>(tile.prepared_kernel);
  p.bias = tile.prepared_bias;
  p.labels = tile.labels;
  p.offsets = tile.offsets;
  p.label_lengths = tile.label_lengths;
  p.B = s.B;
  p.T_max = s.T;
  p.U1 = s.U1;
  p.H = s.H;
  p.Hk = k_extent(s);
  p.V = s.V;
  p.blank = o.blank;
  p.activation = o.activation;
  p.n0 = tile.n0;
  p.rows = tile.rows;
  const size_t bytes = smem_bytes(s);
  auto kernel = joint_tile_kernel<T, kRecompute>;
  Status st =
      cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  if (!st.ok()) return st;
  const int64_t blocks = (tile.rows + kRows - 1) / kRows;
  kernel<<<static_cast<unsigned>(blocks), kThreads, bytes, stream>>>(p);
  return last_launch_status();
}

template <typename Fn>
Status dispatch_half(DType dtype, Fn&& fn) {
  if (dtype == DType::kBFloat16) return fn(__nv_bfloat16());
  if (dtype == DType::kFloat16) return fn(__half());
  return invalid("the fused joint kernels take float16 or bfloat16");
}

}  // namespace

const char* unsupported_reason(const JointShape& s, const JointOptions& o) {
#if !TF_RNNT_FUSED_SM90A
  (void)s;
  (void)o;
  return "tf_rnnt was built without sm_90a code (TF_RNNT_CUDA_ARCHS lacks 90)";
#else
  if (o.dtype == DType::kFloat32) return "the fused joint kernels take float16 or bfloat16";
  if (s.H < 8 || s.H > kMaxH || s.H % 8 != 0) {
    return "the fused joint kernels need H, a multiple of 8, in [8, 640]";
  }
  int device = 0, major = 0, minor = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    return "the current CUDA device could not be queried";
  }
  if (major != 9 || minor != 0) return "the fused joint kernels need a compute capability 9.0 GPU";
  if (static_cast<size_t>(optin) < smem_bytes(s)) {
    return "the fused joint kernels need more shared memory than this GPU offers a block";
  }
  return nullptr;
#endif
}

int64_t prepared_kernel_elements(const JointShape& s) {
  return static_cast<int64_t>(vocab_extent(s)) * k_extent(s);
}

int64_t prepared_bias_elements(const JointShape& s) { return vocab_extent(s); }

int tail_columns(const JointShape& s) {
  const int tail = s.V % kChunk;
  return s.V > kChunk && tail <= 8 ? tail : 0;
}

int64_t wave_tile(int64_t tile) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return tile;
  }
  const int64_t wave = static_cast<int64_t>(sms) * kRows;  // one block an SM (its shared memory)
  return tile >= wave ? tile / wave * wave : tile;
}

int64_t tail_sum_floats(const JointShape& s, int64_t tile) {
  const int columns = tail_columns(s);
  if (columns == 0) return 0;
  return (tile + kRows - 1) / kRows * columns * (s.H + 1);
}

Status prepare(const JointShape& s, const JointOptions& o, const void* kernel, const void* bias,
               void* prepared_kernel, float* prepared_bias, cudaStream_t stream) {
  return dispatch_half(o.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t total = prepared_kernel_elements(s);
    prepare_kernel<T><<<blocks_for(total, 256), 256, 0, stream>>>(
        static_cast<const T*>(kernel), static_cast<const T*>(bias), s.H, s.V, k_extent(s),
        vocab_extent(s), static_cast<T*>(prepared_kernel), prepared_bias);
    return last_launch_status();
  });
}

Status forward(const JointShape& s, const JointOptions& o, const Tile& tile, float* lattice,
               float* lse, cudaStream_t stream) {
  return dispatch_half(o.dtype, [&](auto tag) {
    using T = decltype(tag);
    Params<T> p{};
    p.lattice = lattice;
    p.lse = lse;
    return launch<T, false>(s, o, tile, p, stream);
  });
}

Status recompute(const JointShape& s, const JointOptions& o, const Tile& tile, const float* lse,
                 const float* d_lattice, void* z_out, int z_width, void* d_logits, int logits_width,
                 float* tail_sums_out, cudaStream_t stream) {
  if (z_width < s.H + 1 || logits_width < s.V || logits_width % 8 != 0) {
    return invalid("fused recompute: tile buffers narrower than the joint");
  }
  if (tail_columns(s) > 0 && tail_sums_out == nullptr) {
    return invalid("fused recompute: no buffer for the tail columns' sums");
  }
  return dispatch_half(o.dtype, [&](auto tag) {
    using T = decltype(tag);
    Params<T> p{};
    p.lse = const_cast<float*>(lse);
    p.d_lattice = d_lattice;
    p.z_out = static_cast<T*>(z_out);
    p.z_width = z_width;
    p.d_logits = static_cast<T*>(d_logits);
    p.logits_width = logits_width;
    p.tail_width = tail_columns(s);
    p.tail_sums = tail_sums_out;
    return launch<T, true>(s, o, tile, p, stream);
  });
}

}  // namespace fused
}  // namespace tf_rnnt
