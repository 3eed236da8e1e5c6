// wgmma.mma_async m64nNk16 with float32 accumulators, A and B K-major in shared memory (but for
// Mma<T, 8>::run_transposed_a's A) (PTX ISA, "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate"), for the N the fused joint uses. d holds the warpgroup's [64, N]
// accumulator fragment (N / 2 floats a thread); scale_d = 0 overwrites it, 1 adds to it. Only for
// sm_90a (elsewhere the instructions compile to nothing).
#ifndef TF_RNNT_WGMMA_SM90_CUH_
#define TF_RNNT_WGMMA_SM90_CUH_

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

#endif  // TF_RNNT_WGMMA_SM90_CUH_
