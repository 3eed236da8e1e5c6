// The fused joint tile kernels for Hopper (sm_90a): joint_fused.h says what they compute,
// joint_fused_tile.cuh holds the layouts and epilogues they share with the mma.sync kernels.
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
//                   and pairwise reductions (the epilogue is latency bound), and the picks;
//                   kept (untiled mode), also Z and the rounded logits stored for the backward,
//        recompute: d logits = g_blank (1[v = blank] - p_v) + g_label (1[v = label] - p_v);
//   4. recompute, when the vocabulary ends in a chunk of at most 8 columns (tail_columns): that
//      chunk's d kernel and d bias columns, [Z, 1]^T d logits over the block's rows, from Z in
//      shared memory, so that the backward's d kernel GEMM covers whole chunks only.
// Each row's reductions run in a fixed order (no atomics): results are deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "joint_fused_tile.cuh"
#include "wgmma_sm90.cuh"

namespace tf_rnnt {
namespace fused {
namespace detail {

namespace {

constexpr int kRows = kWgmmaRows;           // nodes per block
constexpr int kStages = 4;                  // kernel buffers in flight
constexpr int kConsumers = 256;             // two warpgroups
constexpr int kThreads = kConsumers + 128;  // and the producer's warpgroup
// Registers per thread once the producer gave its share to the consumers (setmaxnreg):
// 128 x 40 + 256 x 232 of the 64 K an SM has.
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
constexpr int kTableBytes = 2 * kRows * 4;      // the rows' encoder and predictor indices
constexpr int kBarrierBytes = 2 * kStages * 8;  // the full and empty mbarriers
constexpr int kAlign = 1024;                    // the swizzle pattern repeats every 1024 B
static_assert(kMaxH * kRows * 2 == 160 * 1024, "Z of 128 x 640 16-bit values: 160 KB");

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
template <typename T, bool kRecompute, bool kKeep, int nw, bool kTail>
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
    if (kKeep) keep_logits<T, nw, kTail>(p, acc, c * kChunk, lane, rows, block_row0, row0);
    forward_epilogue<T, nw>(p, acc, bias, c * kChunk, lane, rows, st);
  } else {
    capture<T, nw>(acc, c * kChunk, pend);
    recompute_part<T, kTail, 0>(p, *pend, bias, lane, rows, block_row0, row0, tail_words);
    recompute_part<T, kTail, 1>(p, *pend, bias, lane, rows, block_row0, row0, tail_words);
    recompute_part<T, kTail, 2>(p, *pend, bias, lane, rows, block_row0, row0, tail_words);
    recompute_part<T, kTail, 3>(p, *pend, bias, lane, rows, block_row0, row0, tail_words);
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
  node_rows<T, kRows>(p, block_row0, enc_row, pred_row);
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

  // 1. Z in shared memory (and, recomputing or keeping, in p.z_out for the backward GEMMs) by
  // all threads.
  form_block_z<T, kRecompute || kKeep, kRows, kThreads>(p, z_tile, enc_row, pred_row, block_row0,
                                                        kblocks);

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
  init_row_state(&st);
  const int full_chunks = p.V / kChunk;
  const Pipeline pipe{smem_address(z_tile) + warpgroup * 64 * kRowBytes, stages_address, full,
                      empty, kblocks};
  float acc[kChunk / 2];
#pragma unroll
  for (int i = 0; i < kChunk / 2; ++i) acc[i] = 0.f;
  Pending pend;
  uint32_t tail_words[2][4] = {};
  for (int c = 0; c < chunks; ++c) {
#define TF_RNNT_RUN_CHUNK(nw, tail_chunk)                                                        \
  run_chunk<T, kRecompute, kKeep, nw, tail_chunk>(p, pipe, c, acc, lane, rows, block_row0, row0, \
                                                  &st, &pend, tail_words)
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
    // The stage buffers are idle once both warpgroups' wgmmas are done.
    sum_tail<T, kRows, kConsumers>(p, tail_words, lane, row0, z_tile, stages);
  }
  if (!kRecompute) store_forward_rows(p, merge_quad(p, st, rows, lane), rows, lane);
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
