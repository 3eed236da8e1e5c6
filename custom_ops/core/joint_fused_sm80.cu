// The fused joint tile kernels with mma.sync (compute capability 8.0 and up): joint_fused.h says
// what they compute, joint_fused_tile.cuh holds the layouts and epilogues they share with the
// Hopper kernels.
//
// A block takes kRows = 64 consecutive packed nodes: eight warps, two for each 16 rows, each of the
// two taking 64 columns of every chunk (more warps an SM than one a row group would give, in the
// shared memory Z leaves).
//   1. Z for its rows in shared memory, formed by all threads while the first images land;
//   2. the vocabulary in chunks of 128 columns: per K block of 64, the step's 16 KB image of the
//      output layer arrives by cp.async in one of kStages buffers (all threads copy, kStages - 1
//      steps ahead, and one barrier a step frees the buffer read the step before); then per k16
//      slice a warp loads its A fragment (16 rows of Z) and the B fragments (the chunk's 128
//      columns) with ldmatrix, which on the K-major images yields the "col" operand of
//      mma.sync.m16n8k16 as it is, and issues 16 mma.sync (PTX ISA, "Warp-level matrix multiply:
//      mma");
//   3. the chunk's epilogue on the accumulators, as in the Hopper kernels (kept forward: Z and
//      the logits stored too); the images of the next steps keep landing meanwhile. Forward: the
//      two warps of a row group merge their log-sum-exp states (in a fixed order) and picks
//      through shared memory at the end;
//   4. recompute: the tail columns' d kernel and d bias sums (tail_columns), over the buffers.
// Each row's reductions run in a fixed order (no atomics): results are deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "joint_fused_tile.cuh"

namespace tf_rnnt {
namespace fused {
namespace detail {

namespace {

constexpr int kRows = kMmaRows;  // nodes per block
constexpr int kThreads = 256;    // eight warps: 16 rows and half a chunk each
constexpr int kHalf = kChunk / 2;
constexpr int kStages = 3;                     // images in flight
constexpr int kTableBytes = 2 * kRows * 4;     // the rows' encoder and predictor indices
constexpr int kExchangeBytes = kRows * 4 * 4;  // forward: per row, the second half's state
constexpr int kAlign = 128;  // the swizzle spreads a 128-byte row's chunks over the banks
static_assert(kThreads / 32 / 2 * 16 == kRows, "16 rows a pair of warps");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define TF_RNNT_SM80_ASM(...) asm volatile(__VA_ARGS__)
#else
#define TF_RNNT_SM80_ASM(...)
#endif

// 16 bytes from global to shared memory, asynchronously (cp.async; completes with its group).
__device__ __forceinline__ void copy_async(uint32_t dst, const void* src) {
  TF_RNNT_SM80_ASM("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void copy_commit() {
  TF_RNNT_SM80_ASM("cp.async.commit_group;\n" :: : "memory");
}
// Until at most n of this thread's groups are pending.
template <int n>
__device__ __forceinline__ void copy_wait() {
  TF_RNNT_SM80_ASM("cp.async.wait_group %0;\n" ::"n"(n) : "memory");
}

// Four 8x8 matrices of 16-bit values: lane l gives the address of row l mod 8 of matrix l / 8
// and gets, of each matrix, row l / 4, columns 2 (l mod 4) + {0, 1}.
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], uint32_t address) {
  TF_RNNT_SM80_ASM(
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]),
      "=r"(r[2]), "=r"(r[3]) : "r"(address));
}
// Two of them (lanes 0-15 give the addresses).
__device__ __forceinline__ void load_matrices(uint32_t (&r)[2], uint32_t address) {
  TF_RNNT_SM80_ASM("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]),
                   "=r"(r[1]) : "r"(address));
}

// d[16 x 8] += a[16 x 16] b[16 x 8], float32 accumulators; TY is T's PTX type name.
template <typename T>
__device__ __forceinline__ void mma(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
#define TF_RNNT_MMA_M16N8K16(T, TY)                                                               \
  template <>                                                                                     \
  __device__ __forceinline__ void mma<T>(float* d, const uint32_t (&a)[4], uint32_t b0,           \
                                         uint32_t b1) {                                           \
    TF_RNNT_SM80_ASM(                                                                             \
        "mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY                                        \
        ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n" : "+f"(d[0]),    \
        "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), \
        "r"(b1));                                                                                 \
  }
TF_RNNT_MMA_M16N8K16(__nv_bfloat16, "bf16")
TF_RNNT_MMA_M16N8K16(__half, "f16")
#undef TF_RNNT_MMA_M16N8K16

// Where the block's operands are.
struct Operands {
  uint32_t z;       // Z: [kblocks][kRows][128 B]
  uint32_t stages;  // the kStages image buffers
  int kblocks;      // K blocks of 64
  int steps;        // chunks x kblocks
};

// The image of step `step` (if there is one) into its buffer, 16 bytes a thread at a time, as
// one cp.async group (empty past the last step: every thread commits one group a step).
template <typename T>
__device__ __forceinline__ void issue(const Params<T>& p, const Operands& ops, int step) {
  if (step < ops.steps) {
    const uint8_t* src =
        reinterpret_cast<const uint8_t*>(p.kernel_t) + static_cast<int64_t>(step) * kStageBytes;
    const uint32_t dst = ops.stages + (step % kStages) * kStageBytes;
#pragma unroll
    for (int k = 0; k < kStageBytes / 16 / kThreads; ++k) {
      const int i = threadIdx.x + k * kThreads;
      copy_async(dst + 16 * i, src + 16 * i);
    }
  }
  copy_commit();
}

// The warp's nw columns [c0, c0 + nw) of vocabulary chunk c (c0 = c kChunk + 64 half): the
// chunk's K blocks, then the epilogue of those columns; nw = 0 (a half past a narrow last chunk):
// only the K blocks' copies and barriers.
template <typename T, bool kRecompute, bool kKeep, int nw, bool kTail>
__device__ __forceinline__ void run_chunk(const Params<T>& p, const Operands& ops, int c, int half,
                                          int group, int lane, const RowInfo (&rows)[2],
                                          int64_t block_row0, int row0, RowState* st, Pending* pend,
                                          uint32_t (&tail_words)[2][4]) {
  const int c0 = c * kChunk + kHalf * half;
  float bias[kChunk / 4];
#pragma unroll
  for (int j = 0; j < kChunk / 8; ++j) {
    const float2 b =
        j < nw / 8 ? __ldg(reinterpret_cast<const float2*>(p.bias + c0 + 2 * (lane & 3) + 8 * j))
                   : make_float2(kNegInf, kNegInf);
    bias[2 * j] = b.x;
    bias[2 * j + 1] = b.y;
  }
  float acc[kChunk / 2];
#pragma unroll
  for (int i = 0; i < kChunk / 2; ++i) acc[i] = 0.f;
  // ldmatrix rows: A, the group's rows 16 group + (lane mod 16), K chunk lane / 16 of the slice;
  // B, columns (lane mod 8) + 8 (lane / 16) of a pair of 8-column tiles, K chunk (lane / 8) mod 2.
  const int a_row = 16 * group + (lane & 15), a_chunk = lane >> 4;
  const int b_row = kHalf * half + (lane & 7) + ((lane >> 4) << 3), b_chunk = (lane >> 3) & 1;
  for (int kb = 0; kb < ops.kblocks; ++kb) {
    const int step = c * ops.kblocks + kb;
    copy_wait<kStages - 2>();  // this thread's copies of `step` are done
    __syncthreads();           // everyone's; and the buffer of step - 1 is read
    issue(p, ops, step + kStages - 1);
    if constexpr (nw > 0) {
      const uint32_t a_base = ops.z + kb * (kRows * kRowBytes);
      const uint32_t b_base = ops.stages + (step % kStages) * kStageBytes;
#pragma unroll
      for (int kk = 0; kk < kKBlock / 16; ++kk) {
        uint32_t a[4];
        load_matrices(a, a_base + swizzled(a_row, 2 * kk + a_chunk));
        if constexpr (nw == 8) {
          uint32_t b[2];
          load_matrices(b, b_base + swizzled(b_row & ~8, 2 * kk + b_chunk));
          mma<T>(acc, a, b[0], b[1]);
        } else {
#pragma unroll
          for (int jp = 0; jp < nw / 16; ++jp) {
            uint32_t b[4];
            load_matrices(b, b_base + swizzled(16 * jp + b_row, 2 * kk + b_chunk));
            mma<T>(acc + 8 * jp, a, b[0], b[1]);
            mma<T>(acc + 8 * jp + 4, a, b[2], b[3]);
          }
        }
      }
    }
  }
  if constexpr (nw > 0) {
    if (!kRecompute) {
      if (kKeep) keep_logits<T, nw, kTail>(p, acc, c0, lane, rows, block_row0, row0);
      forward_epilogue<T, nw>(p, acc, bias, c0, lane, rows, st);
    } else {
      capture<T, nw>(acc, c0, pend);
      recompute_part<T, kTail, 0>(p, *pend, bias, lane, rows, block_row0, row0, tail_words);
      recompute_part<T, kTail, 1>(p, *pend, bias, lane, rows, block_row0, row0, tail_words);
    }
  }
}

// kKeep: the forward also stores Z and the logits (p.z_out, p.logits_out).
template <typename T, bool kRecompute, bool kKeep>
__global__ void __launch_bounds__(kThreads) mma_tile_kernel(const Params<T> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_address(smem_raw);
  uint8_t* const smem = smem_raw + (((raw + kAlign - 1) & ~uint32_t(kAlign - 1)) - raw);
  const int kblocks = p.Hk / kKBlock;
  uint8_t* const z_tile = smem;
  uint8_t* const stages = z_tile + kblocks * kRows * kRowBytes;
  int32_t* const enc_row = reinterpret_cast<int32_t*>(stages + kStages * kStageBytes);
  int32_t* const pred_row = enc_row + kRows;

  float4* const exchange = reinterpret_cast<float4*>(pred_row + kRows);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int group = warp & 3, half = warp >> 2;  // rows 16 group.., columns 64 half.. of a chunk
  const int64_t block_row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int chunks = (p.V + kChunk - 1) / kChunk;
  const Operands ops{smem_address(z_tile), smem_address(stages), kblocks, chunks * kblocks};

  node_rows<T, kRows>(p, block_row0, enc_row, pred_row);
  for (int step = 0; step < kStages - 1; ++step) issue(p, ops, step);
  __syncthreads();
  form_block_z<T, kRecompute || kKeep, kRows, kThreads>(p, z_tile, enc_row, pred_row, block_row0,
                                                        kblocks);
  // (Z is visible to every warp at the first step's barrier.)

  const int row0 = group * 16 + (lane >> 2);
  const RowInfo rows[2] = {row_info<T, kRecompute>(p, block_row0, row0, enc_row, pred_row),
                           row_info<T, kRecompute>(p, block_row0, row0 + 8, enc_row, pred_row)};
  RowState st;
  init_row_state(&st);
  const int full_chunks = p.V / kChunk;
  const int tail = mma_width(p.V - (chunks - 1) * kChunk);  // the last chunk's width
  Pending pend;
  uint32_t tail_words[2][4] = {};
  for (int c = 0; c < chunks; ++c) {
#define TF_RNNT_RUN_CHUNK(nw, tail_chunk)                                                         \
  run_chunk<T, kRecompute, kKeep, nw, tail_chunk>(p, ops, c, half, group, lane, rows, block_row0, \
                                                  row0, &st, &pend, tail_words)
    if (c < full_chunks) {
      TF_RNNT_RUN_CHUNK(64, false);
    } else if (tail == 128) {
      TF_RNNT_RUN_CHUNK(64, true);
    } else if (half == 1) {
      TF_RNNT_RUN_CHUNK(0, true);
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
    // The tail chunk (at most 8 columns) is the first half's: its four warps sum it, over the
    // buffers once every warp is done with them.
    copy_wait<0>();
    __syncthreads();
    if (half == 0) sum_tail<T, kRows, kThreads / 2>(p, tail_words, lane, row0, z_tile, stages);
  }
  if (!kRecompute) {
    // The row group's two halves merged, the first half's state first.
    RowState m = merge_quad(p, st, rows, lane);
    if (half == 1 && (lane & 3) == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        exchange[row0 + 8 * h] = make_float4(m.lse[h].max, m.lse[h].sum, m.blank[h], m.label[h]);
      }
    }
    __syncthreads();
    if (half == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 o = exchange[row0 + 8 * h];
        LseState other;
        other.max = o.x;
        other.sum = o.y;
        m.lse[h] = lse_merge(m.lse[h], other);
        if (p.blank % kChunk >= kHalf) m.blank[h] = o.z;
        if (rows[h].label >= 0 && rows[h].label % kChunk >= kHalf) m.label[h] = o.w;
      }
      store_forward_rows(p, m, rows, lane);
    }
  }
#endif
}

size_t smem_bytes(const JointShape& s) {
  return static_cast<size_t>(round_up(s.H, kKBlock)) * kRows * 2 + kStages * kStageBytes +
         kTableBytes + kExchangeBytes + kAlign;
}

}  // namespace

size_t mma_smem_bytes(const JointShape& s) { return smem_bytes(s); }

int mma_blocks_per_sm(const JointShape& s) {
  const size_t bytes = smem_bytes(s);
  auto kernel = mma_tile_kernel<__nv_bfloat16, true, false>;
  int blocks = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) !=
          cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, bytes) !=
          cudaSuccess) {
    return 0;
  }
  return blocks;
}

template <typename T, bool kRecompute>
Status launch_mma(const JointShape& s, Params<T> p, cudaStream_t stream) {
  const auto kernel = kRecompute     ? mma_tile_kernel<T, true, false>
                      : p.logits_out ? mma_tile_kernel<T, false, true>
                                     : mma_tile_kernel<T, false, false>;
  return launch_tile_kernel(kernel, p, kRows, kThreads, smem_bytes(s), stream);
}

template Status launch_mma<__half, false>(const JointShape&, Params<__half>, cudaStream_t);
template Status launch_mma<__half, true>(const JointShape&, Params<__half>, cudaStream_t);
template Status launch_mma<__nv_bfloat16, false>(const JointShape&, Params<__nv_bfloat16>,
                                                 cudaStream_t);
template Status launch_mma<__nv_bfloat16, true>(const JointShape&, Params<__nv_bfloat16>,
                                                cudaStream_t);

}  // namespace detail
}  // namespace fused
}  // namespace tf_rnnt
