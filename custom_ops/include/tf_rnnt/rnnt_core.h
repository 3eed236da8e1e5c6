// Framework-free launchers of tf_rnnt's kernels: raw pointers, sizes, options and a stream in,
// a status out. No TensorFlow header; nothing here prints or exits.
//
// Layouts (row-major):
//   lattice  [B, T, U1, 2] float32: (log P(blank | t, u), log P(y_{u+1} | t, u)), U1 = U + 1
//   logits   [B, T, U1, V]   encoder [B, T, H]   predictor [B, U1, H]   kernel [H, V]   bias [V]
//   labels   [B, U] int32 (U = U1 - 1)   logit_lengths / label_lengths [B] int32
#ifndef TF_RNNT_RNNT_CORE_H_
#define TF_RNNT_RNNT_CORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>

namespace tf_rnnt {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,
  kCudaError = 2,
  kBlasError = 3,
  kResourceExhausted = 4
};

struct Status {
  StatusCode code = StatusCode::kOk;
  const char* message = "";  // static string; for kCudaError the CUDA error name
  bool ok() const { return code == StatusCode::kOk; }
};

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline size_t dtype_size(DType d) { return d == DType::kFloat32 ? 4 : 2; }

// Runs fn(begin, end) over [0, total) on the caller's thread pool; cost_per_unit is a rough
// number of cycles per unit of work, used to choose the shard size.
using ParallelFor =
    std::function<void(int64_t total, int64_t cost_per_unit, const std::function<void(int64_t, int64_t)>&)>;

using GpuStream = void*;  // a cudaStream_t

// ---------------------------------------------------------------- lattice loss
struct LatticeLossOptions {
  float fastemit_lambda = 0.f;
  float clamp = -1.f;
};

// costs [B]; grads [B, T, U1, 2] = d cost_b / d lattice (0 outside each sample's rectangle);
// alphas, betas: workspaces of B * T * U1 floats. Lengths are host pointers.
Status lattice_loss_cpu(const float* lattice, const int32_t* logit_lengths,
                        const int32_t* label_lengths, int B, int T, int U1,
                        const LatticeLossOptions& options, float* costs, float* grads,
                        float* alphas, float* betas, const ParallelFor& parallel_for);

// The same on the GPU; lengths are device pointers.
Status lattice_loss_cuda(const float* lattice, const int32_t* logit_lengths,
                         const int32_t* label_lengths, int B, int T, int U1,
                         const LatticeLossOptions& options, float* costs, float* grads,
                         float* alphas, float* betas, GpuStream stream);

// ---------------------------------------------------------------- logits -> lattice
// lattice [B, T, U1, 2] and lse [B, T, U1] (log-sum-exp over V, kept for the backward pass).
// A label outside [0, V) (padding) and u = U give 0 in the label channel.
Status logits_to_lattice_cpu(const void* logits, DType dtype, const int32_t* labels, int B, int T,
                             int U1, int V, int blank, float* lattice, float* lse,
                             const ParallelFor& parallel_for);
Status logits_to_lattice_cuda(const void* logits, DType dtype, const int32_t* labels, int B, int T,
                              int U1, int V, int blank, float* lattice, float* lse,
                              GpuStream stream);

// d_logits = g_blank * (onehot(blank) - softmax) + g_label * (onehot(label) - softmax), per node,
// from d_lattice [B, T, U1, 2]. d_logits may alias logits.
Status logits_to_lattice_grad_cpu(const void* logits, DType dtype, const int32_t* labels, int B,
                                  int T, int U1, int V, int blank, const float* lse,
                                  const float* d_lattice, void* d_logits,
                                  const ParallelFor& parallel_for);
Status logits_to_lattice_grad_cuda(const void* logits, DType dtype, const int32_t* labels, int B,
                                   int T, int U1, int V, int blank, const float* lse,
                                   const float* d_lattice, void* d_logits, GpuStream stream);

// ---------------------------------------------------------------- fused joint ("Flash RNN-T")
// Valid nodes are packed sample after sample, (t, u) row-major inside a sample:
//   node n of sample b at offsets[b] + t * (U_b + 1) + u,   offsets[b+1] = offsets[b] + T_b (U_b + 1)
// and processed in tiles of consecutive packed nodes, so padding costs no GEMM work.
struct JointShape {
  int B = 0, T = 0, U1 = 0, H = 0, V = 0;
  int blank = 0;
  int activation = 0;  // tf_rnnt::Activation
  DType dtype = DType::kFloat32;
  bool allow_tf32 = true;
};

// Bytes of the workspace for tiles of tile_nodes nodes. Tiled mode: one tile's joint values,
// logits and gradients. Untiled mode (tile_nodes = all nodes): the forward pass writes straight
// into saved_hidden / saved_logits; the backward pass needs gradient buffers only.
size_t joint_workspace_bytes_cpu(const JointShape& shape, int64_t tile_nodes, bool backward,
                                 bool untiled);
size_t joint_workspace_bytes_cuda(const JointShape& shape, int64_t tile_nodes, bool backward,
                                  bool untiled);

// Row widths of the tile buffers and of the untiled mode's kept tensors. The GPU path appends a
// ones column to the joint values (through the d kernel GEMM it yields d bias) and pads both
// widths to multiples of 8 for aligned tensor-core GEMMs.
inline int round_up_to_8(int n) { return (n + 7) / 8 * 8; }
inline int joint_hidden_width(const JointShape& s, bool gpu) {
  return gpu ? round_up_to_8(s.H + 1) : s.H;
}
inline int joint_logits_width(const JointShape& s, bool gpu) {
  return gpu ? round_up_to_8(s.V) : s.V;
}

// Host-side plan: packed node offsets [B + 1] from host lengths.
void joint_node_offsets(const int32_t* logit_lengths, const int32_t* label_lengths, int B,
                        int64_t* offsets);

struct JointForwardArgs {
  const int32_t* logit_lengths;  // [B] (host pointer on CPU, device pointer on GPU)
  const int32_t* label_lengths;  // [B]
  const void* encoder;    // [B, T, H] dtype
  const void* predictor;  // [B, U1, H] dtype
  const void* kernel;     // [H, V] dtype
  const void* bias;       // [V] dtype
  const int32_t* labels;  // [B, U]
  const int64_t* node_offsets;  // [B + 1] (host pointer on CPU, device pointer on GPU)
  const int64_t* host_node_offsets;   // [B + 1] host copies (the GPU path plans launches with them)
  const int32_t* host_logit_lengths;  // [B]
  const int32_t* host_label_lengths;  // [B]
  int64_t num_nodes;            // offsets[B]
  int64_t tile_nodes;
  void* workspace;        // joint_workspace_bytes_{cpu,cuda}(shape, tile_nodes, false, untiled)
  float* lattice;         // [B, T, U1, 2] out; 0 outside the valid rectangles
  float* lse;             // [num_nodes] out (packed)
  void* saved_hidden;     // untiled mode: [num_nodes, joint_hidden_width] dtype out (else null)
  float* saved_logits;    // untiled mode: [num_nodes, joint_logits_width] float32 out (else null)
};

struct JointBackwardArgs {
  const int32_t* logit_lengths;  // [B] (host pointer on CPU, device pointer on GPU)
  const int32_t* label_lengths;  // [B]
  const void* encoder;
  const void* predictor;
  const void* kernel;
  const void* bias;
  const int32_t* labels;
  const int64_t* node_offsets;
  const int64_t* host_node_offsets;
  const int32_t* host_logit_lengths;
  const int32_t* host_label_lengths;
  int64_t num_nodes;
  int64_t tile_nodes;
  void* workspace;        // joint_workspace_bytes_{cpu,cuda}(shape, tile_nodes, true, untiled)
  const float* lse;       // [num_nodes]
  const float* d_lattice; // [B, T, U1, 2]
  const void* saved_hidden;  // untiled: as forward (else null: recomputed per tile)
  float* saved_logits;       // untiled: as forward; overwritten by d logits (else null)
  // float32 accumulators, zero-initialized by the launcher:
  float* d_encoder;    // [B, T, H]
  float* d_predictor;  // [B, U1, H]
  float* d_kernel;     // [H, V]
  float* d_bias;       // [V]
};

Status joint_forward_cpu(const JointShape& shape, const JointForwardArgs& args,
                         const ParallelFor& parallel_for);
Status joint_backward_cpu(const JointShape& shape, const JointBackwardArgs& args,
                          const ParallelFor& parallel_for);

// GPU: GEMMs through the cuBLAS library the process has already loaded (TensorFlow's).
Status joint_forward_cuda(const JointShape& shape, const JointForwardArgs& args, GpuStream stream);
Status joint_backward_cuda(const JointShape& shape, const JointBackwardArgs& args,
                           GpuStream stream);

// Device helpers for the glue: packed offsets from device lengths, and float32 -> dtype casts.
Status joint_node_offsets_cuda(const int32_t* logit_lengths, const int32_t* label_lengths, int B,
                               int64_t* offsets, GpuStream stream);
Status cast_float_cuda(const float* in, void* out, DType dtype, int64_t n, GpuStream stream);
Status copy_cuda(void* dst, const void* src, size_t bytes, GpuStream stream);

}  // namespace tf_rnnt

#endif  // TF_RNNT_RNNT_CORE_H_
