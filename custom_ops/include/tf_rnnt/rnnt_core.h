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

#include "tf_rnnt/activation.h"

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
using ParallelFor = std::function<void(int64_t total, int64_t cost_per_unit,
                                       const std::function<void(int64_t, int64_t)>&)>;

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
//   node n of sample b at offsets[b] + t * (U_b + 1) + u,
//   offsets[b + 1] = offsets[b] + T_b * (U_b + 1)
// and processed in tiles of consecutive packed nodes, so padding costs no GEMM work.
// A TDT joint (Xu et al. 2023; tdt_core.h) has D > 0: the last D of the V output columns are
// duration logits, normalized by their own log-softmax, and the lattice has 2 + D channels:
// (log P(blank), log P(y_{u+1})) over the V - D token columns, then log P(durations[i]).
struct JointShape {
  int B = 0, T = 0, U1 = 0, H = 0, V = 0;
  int D = 0;  // duration columns (TDT), 0 for RNN-T
};

// Channels of a node of the joint's lattice, and the token columns the log-sum-exp covers.
inline int lattice_channels(const JointShape& s) { return 2 + s.D; }
inline int token_columns(const JointShape& s) { return s.V - s.D; }

// How the GPU launchers run a joint (the ops' gpu_kernel attribute). kFused: the fused tile
// kernels (Hopper's wgmma kernels: joint values formed on chip, log-sum-exp and d logits in the
// GEMM's epilogue; 16-bit dtypes, H a multiple of 8 up to 640, compute capability 9.0 and a build
// with sm_90a code), or kInvalidArgument where they do not apply; kCublas: the cuBLAS path;
// kAuto: the fused kernels where they apply, else the cuBLAS path. In untiled mode the fused
// forward also keeps the joint values and the logits rounded to dtype for the backward. The CPU
// launchers ignore it.
enum class JointKernel : int { kAuto = 0, kCublas = 1, kFused = 2 };

struct JointOptions {
  int blank = 0;  // in [0, V - D)
  Activation activation = Activation::kTanh;
  DType dtype = DType::kFloat32;  // of encoder, predictor, kernel, bias and the gradients
  bool allow_tf32 = true;         // float32 GEMMs may use TF32 tensor cores (GPU)
  JointKernel kernel = JointKernel::kAuto;
};

// Host-side plan: packed node offsets [B + 1] from host lengths.
void joint_node_offsets(const int32_t* logit_lengths, const int32_t* label_lengths, int B,
                        int64_t* offsets);

// Host memory the launchers plan tiles and launches with.
struct HostPlan {
  const int32_t* logit_lengths = nullptr;  // [B]
  const int32_t* label_lengths = nullptr;  // [B]
  const int64_t* node_offsets = nullptr;   // [B + 1], joint_node_offsets
  int64_t num_nodes = 0;                   // node_offsets[B]
  int64_t tile_nodes = 0;                  // nodes per tile (num_nodes in untiled mode)
};

// The inputs both passes read, on the launcher's device (so for the CPU launchers the lengths
// are host memory, as in `host`).
struct JointInputs {
  const void* encoder = nullptr;           // [B, T, H] dtype
  const void* predictor = nullptr;         // [B, U1, H] dtype
  const void* kernel = nullptr;            // [H, V] dtype
  const void* bias = nullptr;              // [V] dtype
  const int32_t* labels = nullptr;         // [B, U]
  const int32_t* logit_lengths = nullptr;  // [B]
  const int32_t* label_lengths = nullptr;  // [B]
  HostPlan host;
};

// Bytes of the workspace for tiles of tile_nodes nodes. Tiled mode: one tile's joint values,
// logits and gradients. Untiled mode (tile_nodes = all nodes): the forward pass writes straight
// into the saved buffers; the backward pass needs gradient buffers only. The backward workspace
// also holds float32 accumulators of the gradients when dtype is 16-bit.
size_t joint_workspace_bytes_cpu(const JointShape& shape, const JointOptions& options,
                                 int64_t tile_nodes, bool backward, bool untiled);
size_t joint_workspace_bytes_cuda(const JointShape& shape, const JointOptions& options,
                                  int64_t tile_nodes, bool backward, bool untiled);

// Untiled mode keeps each node's joint values (dtype) and logits from the forward pass for the
// backward pass, in a layout each device chooses: elements of the two buffers (the logits'
// buffer in float32 elements, whatever it holds: the GPU's fused kernels keep dtype logits).
struct JointSavedSizes {
  int64_t hidden = 0;
  int64_t logits = 0;
};
JointSavedSizes joint_saved_sizes_cpu(const JointShape& shape, const JointOptions& options,
                                      int64_t num_nodes);
JointSavedSizes joint_saved_sizes_cuda(const JointShape& shape, const JointOptions& options,
                                       int64_t num_nodes);

// ---------------------------------------------------------------- planning a joint pass
// Bytes of one tile's workspace by default. CPU: large tiles buy nothing there (and TensorFlow's
// CPU allocator keeps freed blocks); GPU: large tiles keep the tile GEMMs efficient.
constexpr int64_t kDefaultCpuTileBudget = 64LL << 20;
constexpr int64_t kDefaultGpuTileBudget = 256LL << 20;

// What the caller asks of the tiles (the joint ops' attributes).
struct JointTileRequest {
  int64_t tile_nodes = 0;     // nodes per tile; 0: as many as fit memory_budget
  int64_t memory_budget = 0;  // bytes of a tile's workspace; 0: the device's default
  bool untiled = false;       // one tile of every node, the joint values and logits kept
};

struct JointPassPlan {
  int64_t tile_nodes = 0;      // HostPlan::tile_nodes
  size_t workspace_bytes = 0;  // the pass's workspace for tiles of that many nodes
};

// The workspace of a pass on the GPU (gpu) or the CPU: joint_workspace_bytes_{cuda,cpu}.
size_t joint_workspace_bytes(const JointShape& shape, const JointOptions& options,
                             int64_t tile_nodes, bool backward, bool untiled, bool gpu);

// The one plan of a joint pass over num_nodes valid nodes that the TensorFlow and XLA kernels
// share: kInvalidArgument for sizes the launchers do not take (negative, U1 or V below 1, more
// nodes than B T U1), else the tile (untiled: every node; else request.tile_nodes, else as many
// as fit the budget, by the backward workspace's bytes per node, so that both passes tile alike)
// and the workspace. The tile never grows for fewer nodes: a plan with every node valid bounds
// the workspace of every plan of the shape.
Status plan_joint_pass(const JointShape& shape, const JointOptions& options, int64_t num_nodes,
                       const JointTileRequest& request, bool backward, bool gpu,
                       JointPassPlan* plan);

struct JointForwardArgs {
  JointInputs in;
  void* workspace = nullptr;      // joint_workspace_bytes_{cpu,cuda}(..., false, untiled)
  float* lattice = nullptr;       // [B, T, U1, 2 + D] out; 0 outside the valid rectangles
  float* lse = nullptr;           // [num_nodes] out (packed), over the token columns
  void* saved_hidden = nullptr;   // untiled mode: joint_saved_sizes().hidden dtype out (else null)
  float* saved_logits = nullptr;  // untiled mode: joint_saved_sizes().logits out (else null)
};

struct JointBackwardArgs {
  JointInputs in;
  void* workspace = nullptr;         // joint_workspace_bytes_{cpu,cuda}(..., true, untiled)
  const float* lse = nullptr;        // [num_nodes]
  const float* d_lattice = nullptr;  // [B, T, U1, 2 + D]
  void* saved_hidden = nullptr;      // untiled: as forward, the GPU writes d hidden over it,
                                     // the CPU only reads it (else null: recomputed per tile)
  float* saved_logits = nullptr;     // untiled: as forward; overwritten by d logits (else null)
  // Gradients in dtype, written by the launcher (d kernel and d bias also for an empty batch):
  void* d_encoder = nullptr;    // [B, T, H]
  void* d_predictor = nullptr;  // [B, U1, H]
  void* d_kernel = nullptr;     // [H, V]
  void* d_bias = nullptr;       // [V]
};

Status joint_forward_cpu(const JointShape& shape, const JointOptions& options,
                         const JointForwardArgs& args, const ParallelFor& parallel_for);
Status joint_backward_cpu(const JointShape& shape, const JointOptions& options,
                          const JointBackwardArgs& args, const ParallelFor& parallel_for);

// GPU: GEMMs through the cuBLAS library the process has already loaded (TensorFlow's).
Status joint_forward_cuda(const JointShape& shape, const JointOptions& options,
                          const JointForwardArgs& args, GpuStream stream);
Status joint_backward_cuda(const JointShape& shape, const JointOptions& options,
                           const JointBackwardArgs& args, GpuStream stream);

// Device-to-device copy on the stream (the glue's copy of a shared saved_logits buffer).
Status copy_cuda(void* dst, const void* src, size_t bytes, GpuStream stream);

// Host-to-device copy on the stream through pinned staging buffers, reused once the copies from
// them are done: the host waits for no earlier work of the stream (as a copy from pageable memory
// may), and `host` may be released or changed as soon as this returns.
Status upload_cuda(void* device, const void* host, size_t bytes, GpuStream stream);

}  // namespace tf_rnnt

#endif  // TF_RNNT_RNNT_CORE_H_
