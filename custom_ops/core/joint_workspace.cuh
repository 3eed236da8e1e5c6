// The CUDA joint's workspace (JointBuffers: one pass's buffers carved from it) and tile plan
// (TilePlan: a tile's span over the samples), and which kernels a pass runs (use_fused), for
// joint_cuda.cu, which alone includes this file.
#ifndef TF_RNNT_JOINT_WORKSPACE_CUH_
#define TF_RNNT_JOINT_WORKSPACE_CUH_

#include "joint_cublas_kernels.cuh"

namespace tf_rnnt {
namespace {  // NOLINT: one translation unit

#define RETURN_IF_ERROR(expr)          \
  do {                                 \
    const Status _status = (expr);     \
    if (!_status.ok()) return _status; \
  } while (0)

// The tile [n0, n0 + rows) on the host: its span, the number of chunks it meets and the number
// of (b, u) pairs of the samples it meets.
struct TilePlan {
  TileSpan span;
  int64_t chunks = 0, label_pairs = 0;
};

TilePlan plan_tile(int64_t n0, int64_t rows, const HostPlan& host, int B) {
  TilePlan p;
  const int64_t* offsets = host.node_offsets;
  auto locate = [&](int64_t n, int* b, int* t) {
    // The sample holding node n: the last b with offsets[b] <= n and a non-empty lattice.
    int lo = 0, hi = B - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (offsets[mid] <= n)
        lo = mid;
      else
        hi = mid - 1;
    }
    *b = lo;
    *t = static_cast<int>((n - offsets[lo]) / (host.label_lengths[lo] + 1));
  };
  locate(n0, &p.span.b0, &p.span.t0);
  locate(n0 + rows - 1, &p.span.b1, &p.span.t1);
  for (int b = p.span.b0; b <= p.span.b1; ++b) {
    p.chunks += tile_chunks(b, p.span, host.logit_lengths[b]);
    p.label_pairs += host.label_lengths[b] + 1;
  }
  return p;
}

// Whether a pass runs the fused kernels (options.kernel, joint_fused.h): tiled, the forward and
// the recompute; untiled, the forward, keeping the joint values and rounded logits.
Status use_fused(const JointShape& s, const JointOptions& o, bool* on_chip) {
  *on_chip = false;
  if (o.kernel == JointKernel::kCublas) return Status();
  // kAuto takes the fused kernels where they apply: faster than the cuBLAS path on Hopper.
  if (o.kernel == JointKernel::kAuto) {
    *on_chip = fused::unsupported_reason(s, o) == nullptr;
    return Status();
  }
  const char* why = fused::unsupported_reason(s, o);
  if (why) {
    Status st;
    st.code = StatusCode::kInvalidArgument;
    st.message = why;
    return st;
  }
  *on_chip = true;
  return Status();
}

// use_fused's answer (errors are the pass's to report).
bool fused_pass(const JointShape& s, const JointOptions& o) {
  bool on_chip = false;
  const Status ignored = use_fused(s, o, &on_chip);
  (void)ignored;
  return on_chip;
}

// Width of a pass's logits rows (Vp): a multiple of 8 for aligned tensor-core GEMMs, of 64 where
// the fused kernels write logits or d logits, which the d hidden GEMM sums over (cuBLAS runs
// K = 1088 faster than K = 1032 for V = 1025; docs/design.md).
int pass_logits_width(const JointShape& s, bool on_chip) {
  return on_chip ? (s.V + 63) / 64 * 64 : logits_width(s);
}

// Carves the workspace into the buffers of one pass (with a null base it only counts bytes).
// Tiled mode: z (later d hidden) and logits (later d logits) in the input dtype T. Untiled mode
// (the kept tensors are the caller's; d hidden goes over the kept z), backward: on the cuBLAS
// path with half inputs, d logits in T for all nodes (the fused path's kept logits are T: d
// logits overwrite them).
template <typename T>
struct JointBuffers {
  T* kernel = nullptr;          // backward: [Hk, Vp] (d hidden)
  T* kernel_t = nullptr;        // forward, tiled backward: [Vp, Hk] (logits)
  float* bias = nullptr;        // [Vp], -inf padding
  T* tile_z = nullptr;          // tiled: [tile, Hz], or z^T [Hz, tile rounded up to 8]
  T* tile_logits = nullptr;     // tiled: [tile rounded up to 8, Vp]
  float* d_kernel = nullptr;    // backward: [Hz, Vp] accumulator, d bias in row H
  float* partials = nullptr;    // backward: a tile's d predictor partial sums
  float* tail_sums = nullptr;   // tiled backward, 16-bit T: the fused recompute's tail sums
  T* d_logits = nullptr;        // untiled backward, cuBLAS path, half inputs: [N, Vp]
  T* fused_kernel = nullptr;    // 16-bit T: the fused kernels' output layer
  float* fused_bias = nullptr;  // 16-bit T: and bias
  int64_t* offsets = nullptr;   // [B + 1] packed node offsets
  GradAccumulators acc;         // backward, 16-bit T (float32 T accumulates in the outputs)
  bool on_chip = false;         // the pass runs the fused kernels (use_fused)
  int Vp = 0;                   // pass_logits_width
  size_t bytes = 0;

  JointBuffers(void* base, const JointShape& s, const JointOptions& o, size_t tile, bool backward,
               bool untiled)
      : on_chip(fused_pass(s, o)), Vp(pass_logits_width(s, on_chip)) {
    const size_t Hk = round_up_to_8(s.H), Hz = hidden_width(s);
    char* origin = static_cast<char*>(base);
    auto take = [&](auto*& ptr, size_t count) {
      using P = typename std::remove_reference<decltype(*ptr)>::type;
      ptr = origin ? reinterpret_cast<P*>(origin + bytes) : nullptr;
      bytes += align_up(sizeof(P) * count);
    };
    if (backward) take(kernel, Hk * Vp);
    if (!backward || !untiled) take(kernel_t, Hk * Vp);
    take(bias, Vp);
    if (!untiled) {
      const size_t tile8 = (tile + 7) / 8 * 8;  // the recompute's GEMMs run over a multiple of 8
      take(tile_z, tile8 * Hz);
      take(tile_logits, tile8 * Vp);
    }
    if (backward) {
      take(d_kernel, Hz * Vp);
      take(partials, pred_partial_floats(s, tile));
      if (untiled) {
        if (sizeof(T) != sizeof(float) && !on_chip) take(d_logits, tile * Vp);
      } else if (sizeof(T) != sizeof(float)) {
        take(tail_sums, fused::tail_sum_floats(s, static_cast<int64_t>(tile)));
      }
    }
    if (sizeof(T) != sizeof(float)) {
      take(fused_kernel, fused::prepared_kernel_elements(s));
      take(fused_bias, fused::prepared_bias_elements(s));
    }
    take(offsets, s.B + 1);
    if (backward && sizeof(T) != sizeof(float)) {
      const GradSizes g(s);
      take(acc.d_encoder, g.encoder);
      take(acc.d_predictor, g.predictor);
      take(acc.d_kernel, g.kernel);
      take(acc.d_bias, g.bias);
    }
  }
};

// The fused kernels' view of the tile [n0, n0 + rows).
template <typename T>
fused::Tile fused_tile(const JointInputs& in, const JointBuffers<T>& buf, int64_t n0,
                       int64_t rows) {
  return fused::Tile{in.encoder,       in.predictor, buf.fused_kernel,
                     buf.fused_bias,   in.labels,    buf.offsets,
                     in.label_lengths, n0,           rows};
}

}  // namespace
}  // namespace tf_rnnt

#endif  // TF_RNNT_JOINT_WORKSPACE_CUH_
