// What the TensorFlow kernels (kernels.cc) and the XLA kernels (xla_ops.cc) share: the joint's
// attributes and tile-size rule, its host plan, and the checks of blank, lengths and labels, so
// both paths fail with the same messages.
#ifndef TF_RNNT_TF_KERNEL_SHARED_H_
#define TF_RNNT_TF_KERNEL_SHARED_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {

// Bytes for one tile's workspace by default on the CPU: TensorFlow's CPU allocator keeps freed
// blocks, and large tiles buy nothing on the CPU.
constexpr int64_t kDefaultCpuMemoryBudget = 64LL << 20;
// On the GPU: large tiles keep the tile GEMMs efficient.
constexpr int64_t kDefaultGpuMemoryBudget = 256LL << 20;

// The attributes of TfRnntJointLattice and TfRnntJointLatticeGrad (ops.cc).
struct JointAttrs {
  int blank_attr = 0;
  Activation activation = Activation::kTanh;
  bool untiled = false;
  int64_t tile_nodes = 0;
  int64_t memory_budget = 0;
  bool allow_tf32 = true;

  explicit JointAttrs(::tensorflow::OpKernelConstruction* ctx) {
    std::string act;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("blank", &blank_attr));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("activation", &act));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("untiled", &untiled));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tile_nodes", &tile_nodes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("memory_budget", &memory_budget));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("allow_tf32", &allow_tf32));
    activation = act == "relu"       ? Activation::kRelu
                 : act == "identity" ? Activation::kIdentity
                                     : Activation::kTanh;
  }
};

// The GPU joint's kernel path (JointOptions::kernel) from TF_RNNT_JOINT_KERNEL: "cublas",
// "fused" or "fused-mma" (an error where the fused kernels do not apply), else automatic. Read at
// each call, so a process can compare the paths.
inline JointKernel joint_kernel_from_env() {
  const char* v = std::getenv("TF_RNNT_JOINT_KERNEL");
  if (v && std::string(v) == "cublas") return JointKernel::kCublas;
  if (v && std::string(v) == "fused") return JointKernel::kFused;
  if (v && std::string(v) == "fused-mma") return JointKernel::kFusedMma;
  return JointKernel::kAuto;
}

// Nodes per tile: tile_attr when set, else as many as fit budget_attr (default_budget when 0).
// workspace_bytes(nodes): the backward workspace of a tile of that many nodes.
template <typename WorkspaceBytes>
int64_t joint_tile_nodes(int64_t num_nodes, int64_t tile_attr, int64_t budget_attr,
                         int64_t default_budget, WorkspaceBytes workspace_bytes) {
  if (num_nodes == 0) return 1;
  if (tile_attr > 0) return std::min(tile_attr, num_nodes);
  const int64_t budget = budget_attr > 0 ? budget_attr : default_budget;
  // Marginal bytes per node (the workspace also holds tile-independent buffers).
  const int64_t per_node =
      (static_cast<int64_t>(workspace_bytes(2048)) - static_cast<int64_t>(workspace_bytes(1024))) /
      1024;
  return std::max<int64_t>(1, std::min(num_nodes, budget / std::max<int64_t>(per_node, 1)));
}

// The host plan of the packed nodes from host lengths; *offsets holds the node offsets it points
// to. tile_nodes is left to the caller.
inline HostPlan host_plan(const int32_t* logit_lengths, const int32_t* label_lengths, int B,
                          std::vector<int64_t>* offsets) {
  offsets->resize(B + 1);
  joint_node_offsets(logit_lengths, label_lengths, B, offsets->data());
  HostPlan host;
  host.logit_lengths = logit_lengths;
  host.label_lengths = label_lengths;
  host.node_offsets = offsets->data();
  host.num_nodes = (*offsets)[B];
  return host;
}

// blank_attr (negative: counted from the end) as an index in [0, V); Context is an
// OpKernelContext or an XlaOpKernelContext, failed when the index is out of range.
template <typename Context, typename Index>
bool normalize_blank(Context* ctx, int64_t blank_attr, int64_t V, Index* blank) {
  *blank = static_cast<Index>(blank_attr < 0 ? blank_attr + V : blank_attr);
  if (*blank >= 0 && *blank < V) return true;
  ctx->CtxFailure(__FILE__, __LINE__,
                  ::tensorflow::errors::InvalidArgument("blank = ", blank_attr, " must be in [-", V,
                                                        ", ", V, ") (V, the vocabulary size)"));
  return false;
}

// The first bad length, or "": logit lengths (skipped when null) in [1, T], label lengths in
// [0, U].
inline std::string lengths_error(const int32_t* logit, const int32_t* label, int64_t B, int64_t T,
                                 int64_t U) {
  for (int64_t b = 0; b < B; ++b) {
    if (logit && (logit[b] < 1 || logit[b] > T)) {
      return "logit_lengths[" + std::to_string(b) + "] = " + std::to_string(logit[b]) +
             " must be in [1, " + std::to_string(T) + "] (T, the padded number of frames)";
    }
    if (label[b] < 0 || label[b] > U) {
      return "label_lengths[" + std::to_string(b) + "] = " + std::to_string(label[b]) +
             " must be in [0, " + std::to_string(U) + "] (U, the padded number of labels)";
    }
  }
  return "";
}

// The first bad label, or "": labels[b, u] of the row-major [B, U] labels, for u < lengths[b],
// must be in [0, V) and not blank.
inline std::string labels_error(const int32_t* labels, const int32_t* lengths, int64_t B, int64_t U,
                                int64_t V, int64_t blank) {
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t u = 0; u < lengths[b]; ++u) {
      const int32_t y = labels[b * U + u];
      if (y >= 0 && y < V && y != blank) continue;
      // The message only for a bad label: formed for every label, it took 0.7 ms a step for a
      // batch of 32 x 128 labels.
      const std::string at =
          "labels[" + std::to_string(b) + ", " + std::to_string(u) + "] = " + std::to_string(y);
      if (y == blank) return at + " is the blank index; labels must not contain blank";
      return at + " must be in [0, " + std::to_string(V) + ") (V, the vocabulary size)";
    }
  }
  return "";
}

}  // namespace tf_rnnt

#endif  // TF_RNNT_TF_KERNEL_SHARED_H_
