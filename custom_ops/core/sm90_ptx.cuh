// The Hopper (sm_90a) PTX the fused joint tile kernels use, as inline functions: wgmma and its
// fences and matrix descriptors, mbarriers, bulk copies, named barriers and register
// reallocation; and TmaPipeline, the full/empty mbarrier protocol of a producer streaming
// shared-memory buffers to consumers. Only for sm_90a (elsewhere the wgmma instructions compile
// to nothing and the rest is never called).
//
// wgmma::Mma: wgmma.mma_async m64nNk16 with float32 accumulators, A and B K-major in shared
// memory (but for Mma<T, 8>::run_transposed_a's A) (PTX ISA, "Asynchronous Warpgroup Level
// Matrix Multiply-Accumulate"), for the N the fused joint uses. d holds the warpgroup's [64, N]
// accumulator fragment (N / 2 floats a thread); scale_d = 0 overwrites it, 1 adds to it.
#ifndef TF_RNNT_SM90_PTX_CUH_
#define TF_RNNT_SM90_PTX_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TF_RNNT_SM90A_ASM(...) asm volatile(__VA_ARGS__)
#else
#define TF_RNNT_SM90A_ASM(...)
#endif

namespace tf_rnnt {
namespace wgmma {

template <typename T, int N>
struct Mma;

// Mma<T, N> for the PTX type name TY of T (bf16 or f16).

// m64n8k16, imm-trans-a TRANS_A ("0" or "1").
#define TF_RNNT_WGMMA_N8_ASM(TY, TRANS_A)                    \
  TF_RNNT_SM90A_ASM(                                         \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"            \
      "wgmma.mma_async.sync.aligned.m64n8k16.f32." TY "." TY \
      " "                                                    \
      "{%0, %1, %2, %3}, "                                   \
      "%4, %5, p, 1, 1, " TRANS_A ", 0;\n}\n" : "+f"(d[0]),  \
      "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(a), "l"(b), "r"(scale_d))

// N = 8 also with A MN-major (run_transposed_a): A read as the transpose of a K-major tile.
#define TF_RNNT_WGMMA_N8(T, TY)                                                                 \
  template <>                                                                                   \
  struct Mma<T, 8> {                                                                            \
    static __device__ __forceinline__ void run(float* d, uint64_t a, uint64_t b, int scale_d) { \
      TF_RNNT_WGMMA_N8_ASM(TY, "0");                                                            \
    }                                                                                           \
    static __device__ __forceinline__ void run_transposed_a(float* d, uint64_t a, uint64_t b,   \
                                                            int scale_d) {                      \
      TF_RNNT_WGMMA_N8_ASM(TY, "1");                                                            \
    }                                                                                           \
  };

#define TF_RNNT_WGMMA_N16(T, TY)                                                                \
  template <>                                                                                   \
  struct Mma<T, 16> {                                                                           \
    static __device__ __forceinline__ void run(float* d, uint64_t a, uint64_t b, int scale_d) { \
      TF_RNNT_SM90A_ASM(                                                                        \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"                                          \
          "wgmma.mma_async.sync.aligned.m64n16k16.f32." TY "." TY                               \
          " "                                                                                   \
          "{%0, %1, %2, %3, %4, %5, %6, %7}, "                                                  \
          "%8, %9, p, 1, 1, 0, 0;\n}\n" : "+f"(d[0]),                                           \
          "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),               \
          "+f"(d[7]) : "l"(a), "l"(b), "r"(scale_d));                                           \
    }                                                                                           \
  };

#define TF_RNNT_WGMMA_N32(T, TY)                                                                   \
  template <>                                                                                      \
  struct Mma<T, 32> {                                                                              \
    static __device__ __forceinline__ void run(float* d, uint64_t a, uint64_t b, int scale_d) {    \
      TF_RNNT_SM90A_ASM(                                                                           \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                             \
          "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY                                  \
          " "                                                                                      \
          "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "               \
          "%16, %17, p, 1, 1, 0, 0;\n}\n" : "+f"(d[0]),                                            \
          "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),      \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), \
          "+f"(d[15]) : "l"(a), "l"(b), "r"(scale_d));                                             \
    }                                                                                              \
  };

#define TF_RNNT_WGMMA_N64(T, TY)                                                                   \
  template <>                                                                                      \
  struct Mma<T, 64> {                                                                              \
    static __device__ __forceinline__ void run(float* d, uint64_t a, uint64_t b, int scale_d) {    \
      TF_RNNT_SM90A_ASM(                                                                           \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                             \
          "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                  \
          " "                                                                                      \
          "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "      \
          "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                \
          "%32, %33, p, 1, 1, 0, 0;\n}\n" : "+f"(d[0]),                                            \
          "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),      \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), \
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),            \
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]),            \
          "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) : "l"(a), "l"(b),        \
          "r"(scale_d));                                                                           \
    }                                                                                              \
  };

#define TF_RNNT_WGMMA_N128(T, TY)                                                                  \
  template <>                                                                                      \
  struct Mma<T, 128> {                                                                             \
    static __device__ __forceinline__ void run(float* d, uint64_t a, uint64_t b, int scale_d) {    \
      TF_RNNT_SM90A_ASM(                                                                           \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                             \
          "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY                                 \
          " "                                                                                      \
          "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "      \
          "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, "  \
          "%35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, "  \
          "%52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "                          \
          "%64, %65, p, 1, 1, 0, 0;\n}\n" : "+f"(d[0]),                                            \
          "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),      \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), \
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),            \
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]),            \
          "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),            \
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]),            \
          "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]),            \
          "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),            \
          "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),            \
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),            \
          "+f"(d[63]) : "l"(a), "l"(b), "r"(scale_d));                                             \
    }                                                                                              \
  };

TF_RNNT_WGMMA_N8(__nv_bfloat16, "bf16")
TF_RNNT_WGMMA_N8(__half, "f16")
#undef TF_RNNT_WGMMA_N8
#undef TF_RNNT_WGMMA_N8_ASM

TF_RNNT_WGMMA_N16(__nv_bfloat16, "bf16")
TF_RNNT_WGMMA_N16(__half, "f16")
#undef TF_RNNT_WGMMA_N16

TF_RNNT_WGMMA_N32(__nv_bfloat16, "bf16")
TF_RNNT_WGMMA_N32(__half, "f16")
#undef TF_RNNT_WGMMA_N32

TF_RNNT_WGMMA_N64(__nv_bfloat16, "bf16")
TF_RNNT_WGMMA_N64(__half, "f16")
#undef TF_RNNT_WGMMA_N64

TF_RNNT_WGMMA_N128(__nv_bfloat16, "bf16")
TF_RNNT_WGMMA_N128(__half, "f16")
#undef TF_RNNT_WGMMA_N128

}  // namespace wgmma
}  // namespace tf_rnnt

#undef TF_RNNT_SM90A_ASM

namespace tf_rnnt {
namespace sm90 {

// wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): K-major, 128-byte
// swizzle, 8-row groups 1024 bytes apart (stride byte offset); the leading byte offset is unused
// for this layout.
__device__ __forceinline__ uint64_t matrix_descriptor(uint32_t address) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// The same with both byte offsets `stride` and optionally no swizzle, for the tail sums' operands:
// Z read MN-major (8-row groups 1024 bytes apart, the leading offset unused for 64 columns of
// 16-bit values) and the d logits' unswizzled core matrices (128 bytes apart along K, one along N).
__device__ __forceinline__ uint64_t strided_descriptor(uint32_t address, uint32_t stride,
                                                       bool swizzle) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (uint64_t{stride >> 4} << 16) |
         (uint64_t{stride >> 4} << 32) | (uint64_t{swizzle} << 62);
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

// Named barrier ids (bar.sync; 0 is __syncthreads).
enum NamedBarrier : int { kConsumersBarrier = 1 };

// bar.sync on named barrier `id` by `threads` threads.
template <int id, int threads>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(id), "n"(threads) : "memory");
}

// mbarrier initializations made visible to the other threads and to the async proxy.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Registers per thread of the warpgroup lowered or raised to `registers` (setmaxnreg).
template <int registers>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(registers));
}
template <int registers>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(registers));
}

// The full/empty mbarrier protocol of kStages shared-memory buffers that a producer thread fills
// by bulk copies (as CUTLASS's PipelineTmaAsync), for kOwners consumer groups that take the
// steps in turn: a "full" mbarrier per (owner, buffer) that the copy's bytes complete, and an
// "empty" one per buffer, released by kReleases arrivals of the step's owner. Step s goes to
// buffer s mod kStages; the first kStages need no release.
template <int kStages, int kOwners>
struct TmaPipeline {
  static constexpr int kBarrierBytes = (kOwners + 1) * kStages * 8;
  uint32_t full;   // [kOwners][kStages] mbarriers, 8 bytes apart
  uint32_t empty;  // [kStages]

  // The mbarriers at `barriers` (kBarrierBytes of shared memory).
  __device__ __forceinline__ explicit TmaPipeline(uint32_t barriers)
      : full(barriers), empty(barriers + 8 * kOwners * kStages) {}

  // By one thread, before the block's __syncthreads.
  template <int kReleases>
  __device__ __forceinline__ void init() const {
    for (int s = 0; s < kOwners * kStages; ++s) {
      mbarrier_init(full + 8 * s, 1);  // the producer's arrival and the copy's bytes
    }
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(empty + 8 * s, kReleases);
    }
    fence_mbarrier_init();
  }

  // Producer: waits until the owner of step `step` - kStages released its buffer.
  __device__ __forceinline__ void producer_acquire(int step) const {
    mbarrier_wait(empty + 8 * (step % kStages), (step / kStages - 1) & 1);
  }
  // Producer: the full mbarrier of `stage` for `owner`, armed for `bytes`, on which the copy
  // into the buffer completes.
  __device__ __forceinline__ uint32_t producer_commit(int owner, int stage, uint32_t bytes) const {
    const uint32_t bar = full + 8 * (owner * kStages + stage);
    mbarrier_arrive_expect_tx(bar, bytes);
    return bar;
  }

  // A consumer group's view: its full mbarriers and the parity it waits for next on each buffer.
  struct Consumer {
    uint32_t full, empty;
    uint32_t phases;  // bit s: the parity of buffer s's next phase

    // Waits until buffer `stage` is full, and moves on to its next phase.
    __device__ __forceinline__ void consumer_wait(int stage) {
      mbarrier_wait(full + 8 * stage, (phases >> stage) & 1u);
      phases ^= 1u << stage;
    }
    // One of the kReleases arrivals that give buffer `stage` back to the producer.
    __device__ __forceinline__ void consumer_release(int stage) const {
      mbarrier_arrive(empty + 8 * stage);
    }
  };
  __device__ __forceinline__ Consumer consumer(int owner) const {
    return Consumer{full + 8 * kStages * owner, empty, 0u};
  }
};

}  // namespace sm90
}  // namespace tf_rnnt

#endif  // TF_RNNT_SM90_PTX_CUH_
