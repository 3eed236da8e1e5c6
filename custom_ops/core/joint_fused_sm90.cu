// The fused joint tile kernels for Hopper (sm_90a): joint_fused.h says what they compute,
// joint_fused_tile.cuh holds their layouts and epilogues, sm90_ptx.cuh the PTX they use.
//
// A block takes kRows = 128 consecutive packed nodes: two consumer warpgroups and a producer
// warpgroup, one thread of which issues the copies.
//   1. Z = act(encoder[b, t] + predictor[b, u]) for its rows, formed once in shared memory by all
//      threads (while the producer's first copies land) in the wgmma K-major layout with the
//      128-byte swizzle (16-byte chunk c of row r stored at chunk c ^ (r mod 8)), H padded with
//      zeros to a multiple of 64;
//   2. the vocabulary in chunks of 128 columns, the even chunks to warpgroup 0 and the odd ones to
//      warpgroup 1, each over all 128 rows: logits = Z @ kernel[:, chunk] by wgmma (two of
//      64 rows a K step), A (Z) and B from shared memory, float32 accumulators in registers. B is
//      the output layer prepared as one 16 KB image per (chunk, K block) step, already swizzled,
//      which the producer streams in step order through kStages buffers with bulk copies
//      (cp.async.bulk); a "full" mbarrier per (warpgroup, buffer) and an "empty" one per buffer
//      pace it (sm90::TmaPipeline). So while one warpgroup runs a chunk's epilogue, the other's
//      wgmmas keep the tensor cores busy, and the stream runs kStages steps ahead of both;
//   3. an epilogue per chunk on the accumulators: the logits rounded to the input dtype (as the
//      cuBLAS path's logits tile and a mixed-precision Dense layer), plus bias, then
//        forward:   the online log-sum-exp (Milakov & Gimelshein 2018), one rescale per chunk
//                   and pairwise reductions, and the picks; the two warpgroups' states merged
//                   once at the end (warpgroup 0's first); kept (untiled mode), also Z and the
//                   rounded logits stored for the backward,
//        recompute: d logits = g_blank (1[v = blank] - p_v) + g_label (1[v = label] - p_v);
//   4. recompute, when the vocabulary ends in a chunk of at most 8 columns (tail_columns): that
//      chunk's d kernel and d bias columns, [Z, 1]^T d logits over the block's rows, from Z in
//      shared memory (Z^T d logits by wgmma, reading Z's tile MN-major), so that the backward's
//      d kernel GEMM covers whole chunks only.
// Each row's reductions run in a fixed order (no atomics): results are deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "joint_fused_tile.cuh"
#include "sm90_ptx.cuh"

namespace tf_rnnt {
namespace fused {
namespace detail {

namespace {

using namespace ::tf_rnnt::sm90;  // NOLINT: the PTX wrappers

constexpr int kRows = kWgmmaRows;           // nodes per block
constexpr int kStages = 4;                  // kernel buffers in flight
constexpr int kConsumers = 256;             // two warpgroups
constexpr int kThreads = kConsumers + 128;  // and the producer's warpgroup
// Registers per thread once the producer gave its share to the consumers (setmaxnreg):
// 128 x 40 + 256 x 232 of the 64 K an SM has.
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
constexpr int kHalves = 2;  // wgmmas of 64 rows that cover a block's rows
// The rows' encoder and predictor indices; once Z is formed, the forward's exchange of the two
// warpgroups' log-sum-exp states (two floats a row).
constexpr int kTableBytes = 2 * kRows * 4;
// The kernel buffers' mbarriers: full per (warpgroup, buffer), empty per buffer.
using Stages = TmaPipeline<kStages, 2>;
constexpr int kBarrierBytes = Stages::kBarrierBytes;
constexpr int kAlign = 1024;  // the swizzle pattern repeats every 1024 B
static_assert(kMaxH * kRows * 2 == 160 * 1024, "Z of 128 x 640 16-bit values: 160 KB");

// A warpgroup's mainloop operands: Z and the kernel buffers.
struct Operands {
  uint32_t a_address;       // Z
  uint32_t stages_address;  // the kStages kernel buffers
  int kblocks;              // K blocks of 64
};

// One vocabulary chunk c of nw columns over the block's rows: per K block, wait until its buffer
// is full, four k16 steps of two wgmmas (rows 0-63 and 64-127), and once the step before's
// wgmmas are done, release that step's buffer; then the chunk's epilogue.
template <typename T, bool kRecompute, bool kKeep, int nw, bool kTail>
__device__ __forceinline__ void run_chunk(const Params<T>& p, const Operands& pipe, int c,
                                          float (&acc)[kHalves][kChunk / 2],
                                          Stages::Consumer& stages, int lane,
                                          const RowInfo (&rows)[kHalves][2], int64_t block_row0,
                                          int row0, RowState (&st)[kHalves],
                                          uint32_t (&tail_words)[kHalves][2][4]) {
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
  // Zeroed here rather than by the first wgmma's scale_d, so that the last chunk's values are
  // dead once its epilogue read them (registers for the epilogue's own values).
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
#pragma unroll
    for (int i = 0; i < kChunk / 2; ++i) acc[h][i] = 0.f;
  }
  const int step0 = c * pipe.kblocks;
  for (int kb = 0; kb < pipe.kblocks; ++kb) {
    const int step = step0 + kb, stage = step % kStages;
    stages.consumer_wait(stage);
    const uint32_t a_base = pipe.a_address + kb * (kRows * kRowBytes);
    const uint32_t b_base = pipe.stages_address + stage * kStageBytes;
    fence_registers(acc[0]);
    fence_registers(acc[1]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKBlock / 16; ++kk) {
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        wgmma::Mma<T, nw>::run(acc[h], matrix_descriptor(a_base + h * 64 * kRowBytes + 32 * kk),
                               matrix_descriptor(b_base + 32 * kk), 1);
      }
    }
    wgmma_commit();
    wgmma_wait<1>();
    fence_registers(acc[0]);
    fence_registers(acc[1]);
    if (kb > 0 && lane == 0) stages.consumer_release((step - 1) % kStages);
  }
  wgmma_wait<0>();
  fence_registers(acc[0]);
  fence_registers(acc[1]);
  if (lane == 0) stages.consumer_release((step0 + pipe.kblocks - 1) % kStages);
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    const int rows0 = row0 + 64 * h;
    if (!kRecompute) {
      if (kKeep) keep_logits<T, nw, kTail>(p, acc[h], c * kChunk, lane, rows[h], block_row0, rows0);
      forward_epilogue<T, nw>(p, acc[h], bias, c * kChunk, lane, rows[h], &st[h]);
    } else {
      Pending pend;
      capture<T, nw>(acc[h], c * kChunk, &pend);
      recompute_part<T, kTail, 0>(p, pend, bias, lane, rows[h], block_row0, rows0, tail_words[h]);
      recompute_part<T, kTail, 1>(p, pend, bias, lane, rows[h], block_row0, rows0, tail_words[h]);
      recompute_part<T, kTail, 2>(p, pend, bias, lane, rows[h], block_row0, rows0, tail_words[h]);
      recompute_part<T, kTail, 3>(p, pend, bias, lane, rows[h], block_row0, rows0, tail_words[h]);
    }
  }
}

// The warpgroup that takes vocabulary column v.
__device__ __forceinline__ int column_owner(int v) { return (v / kChunk) & 1; }

// The forward's results once both warpgroups are done: per row, the quad's partial states merged
// (merge_quad), then warpgroup 0's state with warpgroup 1's (through `exchange`, [kRows][2]
// floats over the node table, named barrier 1 over the consumers); lse by warpgroup 0, each
// log-probability by the warpgroup whose chunk holds its column.
template <typename T>
__device__ __forceinline__ void store_block_rows(const Params<T>& p, const RowState (&st)[kHalves],
                                                 const RowInfo (&rows)[kHalves][2], int lane,
                                                 int row0, int warpgroup, float* exchange) {
  RowState m[kHalves];
#pragma unroll
  for (int h = 0; h < kHalves; ++h) m[h] = merge_quad(p, st[h], rows[h], lane);
  // Nothing holds a warpgroup with few or no chunks back (for V of at most kStages steps), so it
  // can get here before the other's row_info read the node table that `exchange` overwrites.
  named_barrier_sync<kConsumersBarrier, kConsumers>();
  const bool quad_lead = (lane & 3) == 0;
  const auto slot = [&](int h, int half) { return exchange + 2 * (row0 + 64 * h + 8 * half); };
  if (warpgroup == 1 && quad_lead) {
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        slot(h, half)[0] = m[h].lse[half].max;
        slot(h, half)[1] = m[h].lse[half].sum;
      }
    }
  }
  named_barrier_sync<kConsumersBarrier, kConsumers>();
  if (warpgroup == 0 && quad_lead) {
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const LseState other{slot(h, half)[0], slot(h, half)[1]};
        m[h].lse[half] = lse_merge(m[h].lse[half], other);
        slot(h, half)[0] = m[h].lse[half].max;
        slot(h, half)[1] = m[h].lse[half].sum;
      }
    }
  }
  named_barrier_sync<kConsumersBarrier, kConsumers>();
  if (!quad_lead) return;
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const RowInfo& r = rows[h][half];
      if (!r.valid) continue;
      const LseState s{slot(h, half)[0], slot(h, half)[1]};
      if (warpgroup == 0) p.lse[r.node] = lse_value(s);
      if (column_owner(p.blank) == warpgroup) {
        p.lattice[2 * r.padded] = log_softmax_at(m[h].blank[half], s);
      }
      if (r.label >= 0 && column_owner(r.label) == warpgroup) {
        p.lattice[2 * r.padded + 1] = log_softmax_at(m[h].label[half], s);
      }
    }
  }
}

// The recompute's tail sums (tail_columns): tail_sums[block, j, h] += sum over the block's rows r
// of Z[r, h] d logits[r, V0 + j], V0 the tail chunk's first column, as a [64, 8] wgmma Z^T d_tail
// over the rows per K block of Z (the K blocks split over the warpgroups); for h = H (Z's ones
// column: d bias) one thread per column sums the rows in order. Where holds_words, the quad's
// lane 0 holds in tail_words[h][half] the d logits of columns V0 .. V0 + 7 (rounded to T, as the
// GEMMs read them) of row row0 + 64 h + 8 half. They go to the stage buffers, idle by then, as
// the B operand: K-major without swizzle, core matrix g (rows 8 g .. 8 g + 7) at 128 g bytes,
// column j's eight values its 16-byte row j.
template <typename T>
__device__ __forceinline__ void sum_tail_wgmma(const Params<T>& p,
                                               const uint32_t (&tail_words)[kHalves][2][4],
                                               bool holds_words, int lane, int row0, int warpgroup,
                                               const uint8_t* z_tile, uint8_t* stages) {
  uint16_t* const d_tail = reinterpret_cast<uint16_t*>(stages);
  // Both warpgroups' wgmmas are done with the stage buffers.
  named_barrier_sync<kConsumersBarrier, kConsumers>();
  if (holds_words && (lane & 3) == 0) {
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = row0 + 64 * h + 8 * half;
        uint16_t* const row = d_tail + (r / 8) * 64 + r % 8;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint32_t w = tail_words[h][half][k];
          row[8 * (2 * k)] = static_cast<uint16_t>(w & 0xFFFFu);
          row[8 * (2 * k + 1)] = static_cast<uint16_t>(w >> 16);
        }
      }
    }
  }
  fence_async_shared();
  named_barrier_sync<kConsumersBarrier, kConsumers>();
  const int H1 = p.H + 1, kblocks = p.Hk / kKBlock, warp = (threadIdx.x >> 5) & 3;
  float* const slot = p.tail_sums + static_cast<int64_t>(blockIdx.x) * p.tail_width * H1;
  const uint32_t z_address = smem_address(z_tile), d_address = smem_address(d_tail);
  for (int kb = warpgroup; kb < kblocks; kb += 2) {
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    const uint32_t a_base = z_address + kb * (kRows * kRowBytes);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kRows / 16; ++k) {
      wgmma::Mma<T, 8>::run_transposed_a(
          d, strided_descriptor(a_base + 16 * k * kRowBytes, 1024, true),
          strided_descriptor(d_address + 256 * k, 128, false), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(d);
    // The fragment: d[i] is Z column kb 64 + 16 warp + lane / 4 + 8 (i / 2), tail column
    // 2 (lane mod 4) + i mod 2.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = kb * kKBlock + 16 * warp + (lane >> 2) + 8 * (i >> 1);
      const int j = 2 * (lane & 3) + (i & 1);
      if (j < p.tail_width && h < p.H) slot[j * H1 + h] += d[i];
    }
  }
  const int j = threadIdx.x & 127;
  if (warpgroup == 1 && j < p.tail_width) {
    const T* const values = reinterpret_cast<const T*>(d_tail);
    float sum = 0.f;
    for (int r = 0; r < kRows; ++r) sum += to_float(values[(r / 8) * 64 + 8 * j + r % 8]);
    slot[j * H1 + p.H] += sum;
  }
}

// kKeep: the forward also stores Z and the logits (p.z_out, p.logits_out).
template <typename T, bool kRecompute, bool kKeep>
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
  const Stages pipeline(smem_address(pred_row + kRows));

  const int tid = threadIdx.x, lane = tid & 31;
  const int64_t block_row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int chunks = (p.V + kChunk - 1) / kChunk, steps = chunks * kblocks;
  const uint32_t stages_address = smem_address(stages);

  // A release is one arrival per warp of the step's owner.
  if (tid == 0) pipeline.init<kConsumers / 64>();
  node_rows<T, kRows>(p, block_row0, enc_row, pred_row);
  __syncthreads();

  // Step s (chunk s / kblocks) into buffer s mod kStages; the first kStages need no release, so
  // their copies run while Z forms. Of a narrower last chunk only its rows are copied (a prefix of
  // the image).
  const int tail = mma_width(p.V - (chunks - 1) * kChunk);  // the last chunk's wgmma width
  const auto issue = [&](int step) {
    const int stage = step % kStages, owner = (step / kblocks) & 1;
    const uint32_t bytes = step / kblocks == chunks - 1 ? tail * kRowBytes : kStageBytes;
    const uint32_t bar = pipeline.producer_commit(owner, stage, bytes);
    bulk_copy(stages_address + stage * kStageBytes,
              p.kernel_t + static_cast<int64_t>(step) * (kStageBytes / sizeof(T)), bytes, bar);
  };
  if (tid == kConsumers) {
    for (int step = 0; step < kStages && step < steps; ++step) issue(step);
  }

  // 1. Z in shared memory (and, recomputing or keeping, in p.z_out for the backward GEMMs) by
  // all threads.
  form_block_z<T, kRecompute || kKeep, kRows, kThreads>(p, z_tile, enc_row, pred_row, block_row0,
                                                        kblocks);

  // Z visible to the tensor cores.
  fence_async_shared();
  __syncthreads();

  if (tid >= kConsumers) {
    release_registers<kProducerRegisters>();
    // The producer: the other steps, each once its owner released the step kStages before.
    if (tid == kConsumers) {
      for (int step = kStages; step < steps; ++step) {
        pipeline.producer_acquire(step);
        issue(step);
      }
    }
    return;
  }
  claim_registers<kConsumerRegisters>();

  // 2-3. The chunks: warpgroup w takes chunks w, w + 2, ...
  const int warpgroup = tid >> 7, warp = (tid >> 5) & 3;
  const int row0 = warp * 16 + (lane >> 2);
  RowInfo rows[kHalves][2];
  RowState st[kHalves];
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      rows[h][half] =
          row_info<T, kRecompute>(p, block_row0, row0 + 64 * h + 8 * half, enc_row, pred_row);
    }
    init_row_state(&st[h]);
  }
  const int full_chunks = p.V / kChunk;
  const Operands pipe{smem_address(z_tile), stages_address, kblocks};
  Stages::Consumer stage_buffers = pipeline.consumer(warpgroup);
  float acc[kHalves][kChunk / 2];
  uint32_t tail_words[kHalves][2][4] = {};
  for (int c = warpgroup; c < chunks; c += 2) {
#define TF_RNNT_RUN_CHUNK(nw, tail_chunk)                                                     \
  run_chunk<T, kRecompute, kKeep, nw, tail_chunk>(p, pipe, c, acc, stage_buffers, lane, rows, \
                                                  block_row0, row0, st, tail_words)
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
    sum_tail_wgmma(p, tail_words, warpgroup == column_owner(p.V - 1), lane, row0, warpgroup, z_tile,
                   stages);
  }
  if (!kRecompute) {
    store_block_rows(p, st, rows, lane, row0, warpgroup, reinterpret_cast<float*>(enc_row));
  }
#endif
}

size_t smem_bytes(const JointShape& s) {
  return static_cast<size_t>(round_up(s.H, kKBlock)) * kRows * 2 + kStages * kStageBytes +
         kTableBytes + kBarrierBytes + kAlign;
}

}  // namespace

size_t wgmma_smem_bytes(const JointShape& s) { return smem_bytes(s); }

template <typename T, bool kRecompute>
Status launch_wgmma(const JointShape& s, Params<T> p, cudaStream_t stream) {
  const auto kernel = kRecompute     ? joint_tile_kernel<T, true, false>
                      : p.logits_out ? joint_tile_kernel<T, false, true>
                                     : joint_tile_kernel<T, false, false>;
  return launch_tile_kernel(kernel, p, kRows, kThreads, smem_bytes(s), stream);
}

template Status launch_wgmma<__half, false>(const JointShape&, Params<__half>, cudaStream_t);
template Status launch_wgmma<__half, true>(const JointShape&, Params<__half>, cudaStream_t);
template Status launch_wgmma<__nv_bfloat16, false>(const JointShape&, Params<__nv_bfloat16>,
                                                   cudaStream_t);
template Status launch_wgmma<__nv_bfloat16, true>(const JointShape&, Params<__nv_bfloat16>,
                                                  cudaStream_t);

}  // namespace detail
}  // namespace fused
}  // namespace tf_rnnt
