// What the TensorFlow kernels (kernels.cc, tdt_ops.cc) and the XLA kernels (xla_lowering.cc,
// xla_handlers.cc) share: the joint's attributes, the shape checks, its host plan, and the checks
// of blank, lengths and labels, so that every path fails with the same messages.
#ifndef TF_RNNT_TF_KERNEL_SHARED_H_
#define TF_RNNT_TF_KERNEL_SHARED_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/lib/core/threadpool.h"
#include "tf_rnnt/rnnt_core.h"

#if TF_RNNT_WITH_CUDA
#include "xla/stream_executor/stream.h"
#endif

namespace tf_rnnt {

// The gpu_kernel attribute's value ("auto", "fused" or "cublas") as JointOptions::kernel.
inline JointKernel joint_kernel_from_attr(const std::string& name) {
  if (name == "fused") return JointKernel::kFused;
  if (name == "cublas") return JointKernel::kCublas;
  return JointKernel::kAuto;
}

// The attributes of TfRnntJointLattice and TfRnntJointLatticeGrad (ops.cc).
struct JointAttrs {
  int blank_attr = 0;
  Activation activation = Activation::kTanh;
  bool untiled = false;
  int64_t tile_nodes = 0;
  int64_t memory_budget = 0;
  bool allow_tf32 = true;
  JointKernel kernel = JointKernel::kAuto;  // GPU only
  int num_durations = 0;                    // JointShape::D

  explicit JointAttrs(::tensorflow::OpKernelConstruction* ctx) {
    std::string act, gpu_kernel;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("blank", &blank_attr));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_durations", &num_durations));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("activation", &act));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("untiled", &untiled));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tile_nodes", &tile_nodes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("memory_budget", &memory_budget));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("allow_tf32", &allow_tf32));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("gpu_kernel", &gpu_kernel));
    kernel = joint_kernel_from_attr(gpu_kernel);
    activation = act == "relu"       ? Activation::kRelu
                 : act == "identity" ? Activation::kIdentity
                                     : Activation::kTanh;
  }

  // What the attributes ask of the tiles; `untiled` only where the kernel honours it.
  JointTileRequest tile_request(bool honour_untiled) const {
    JointTileRequest r;
    r.tile_nodes = tile_nodes;
    r.memory_budget = memory_budget;
    r.untiled = honour_untiled && untiled;
    return r;
  }
};

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

// ------------------------------------------------------------------ shape checks
// An input's dimensions (its rank is their count), for the shape checks below, which the graph
// kernels run on their tensors, the XLA lowering on the static shapes and the XLA handlers on
// their buffers: "" when the shapes are good, else the first problem.
using Dims = std::vector<int64_t>;

// As TensorShape::DebugString: "[2,3,4]".
inline std::string shape_string(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

// `name` must be a [B] vector; `what` follows the expected shape in the message.
inline std::string batch_vector_error(const char* name, const Dims& d, int64_t B,
                                      const char* what = " (the batch size)") {
  if (d.size() == 1 && d[0] == B) return "";
  return std::string(name) + " must have shape [" + std::to_string(B) + "]" + what + ", got " +
         shape_string(d);
}

// TfRnntJointLattice and its gradient: encoder [B, T, H], predictor [B, U+1, H], kernel [H, V],
// bias [V], labels [B, U], logit and label lengths [B].
inline std::string joint_shapes_error(const Dims& enc, const Dims& pred, const Dims& kernel,
                                      const Dims& bias, const Dims& labels,
                                      const Dims& logit_lengths, const Dims& label_lengths,
                                      int64_t num_durations = 0) {
  if (enc.size() != 3) return "encoder must have shape [B, T, H], got " + shape_string(enc);
  const int64_t B = enc[0], H = enc[2];
  if (pred.size() != 3 || pred[0] != B || pred[2] != H) {
    return "predictor must have shape [" + std::to_string(B) + ", U+1, " + std::to_string(H) +
           "] (batch and H of encoder " + shape_string(enc) + "), got " + shape_string(pred);
  }
  const int64_t U1 = pred[1];
  if (U1 < 1) return "predictor must have U+1 >= 1 steps";
  if (kernel.size() != 2 || kernel[0] != H) {
    return "kernel must have shape [" + std::to_string(H) + ", V] (H of encoder " +
           shape_string(enc) + "), got " + shape_string(kernel);
  }
  const int64_t V = kernel[1];
  if (V < 1) return "kernel must have V >= 1 columns";
  if (num_durations > 0 && V <= num_durations) {
    return "kernel must have V + D columns, V >= 1 token columns then D = " +
           std::to_string(num_durations) + " duration columns, got " + shape_string(kernel);
  }
  if (bias.size() != 1 || bias[0] != V) {
    return "bias must have shape [" + std::to_string(V) + "] (V of kernel " + shape_string(kernel) +
           "), got " + shape_string(bias);
  }
  if (labels.size() != 2 || labels[0] != B || labels[1] != U1 - 1) {
    return "labels must have shape [" + std::to_string(B) + ", " + std::to_string(U1 - 1) +
           "] ([B, U] for predictor " + shape_string(pred) + "), got " + shape_string(labels);
  }
  std::string error = batch_vector_error("logit_lengths", logit_lengths, B);
  return error.empty() ? batch_vector_error("label_lengths", label_lengths, B) : error;
}

// TfRnntLatticeLoss: lattice [B, T, U+1, 2], logit and label lengths [B] (with unvalidated
// lengths, also T >= 1 and U+1 >= 1 unless B = 0).
inline std::string lattice_loss_shapes_error(const Dims& lattice, const Dims& logit_lengths,
                                             const Dims& label_lengths, bool validated) {
  if (lattice.size() != 4 || lattice[3] != 2) {
    return "lattice must have shape [B, T, U+1, 2], got " + shape_string(lattice);
  }
  const int64_t B = lattice[0];
  if (!validated && B != 0 && (lattice[1] < 1 || lattice[2] < 1)) {
    return "lattice must have T >= 1 and U+1 >= 1, got " + shape_string(lattice);
  }
  std::string error = batch_vector_error("logit_lengths", logit_lengths, B);
  return error.empty() ? batch_vector_error("label_lengths", label_lengths, B) : error;
}

// TfRnntLogitsToLattice: logits [B, T, U+1, V] with V >= 1, labels [B, U], and (validating)
// label lengths [B].
inline std::string logits_to_lattice_shapes_error(const Dims& logits, const Dims& labels,
                                                  const Dims* label_lengths) {
  if (logits.size() != 4) {
    return "logits must have shape [B, T, U+1, V], got " + shape_string(logits);
  }
  const int64_t B = logits[0], U1 = logits[2];
  if (labels.size() != 2 || labels[0] != B || labels[1] != U1 - 1) {
    return "labels must have shape [" + std::to_string(B) + ", " + std::to_string(U1 - 1) +
           "] ([B, U] for logits of shape " + shape_string(logits) + "), got " +
           shape_string(labels);
  }
  if (logits[3] < 1) return "logits must have a non-empty vocabulary axis";
  return label_lengths ? batch_vector_error("label_lengths", *label_lengths, B, "") : "";
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

// ------------------------------------------------------------------ TensorFlow kernels
// The TensorFlow names the kernels use.
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::errors::InvalidArgument;

// The devices of the kernel templates (kernels.cc, tdt_ops.cc).
struct CpuDevice {};
struct GpuDevice {};

// ParallelFor on the op's CPU worker threads.
inline ParallelFor cpu_parallel_for(::tensorflow::OpKernelContext* ctx) {
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  return [workers](int64_t total, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) {
    workers->ParallelFor(total, cost, fn);
  };
}

#if TF_RNNT_WITH_CUDA
// The op's CUDA stream.
inline GpuStream gpu_stream(::tensorflow::OpKernelContext* ctx) {
  return ctx->op_device_context()->stream()->platform_specific_handle().stream;
}
#endif

// Allocates a lattice loss's outputs, costs [B] and grads (the lattice's shape), then unless B is
// 0 its alphas and betas [B, T, U1]; the context fails when an allocation does.
inline void allocate_lattice_loss(OpKernelContext* ctx, const Tensor& lattice, Tensor** costs,
                                  Tensor** grads, Tensor* alphas, Tensor* betas) {
  const int64_t B = lattice.dim_size(0), T = lattice.dim_size(1), U1 = lattice.dim_size(2);
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({B}), costs));
  OP_REQUIRES_OK(ctx, ctx->allocate_output(1, lattice.shape(), grads));
  if (B == 0) return;
  OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({B, T, U1}), alphas));
  OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({B, T, U1}), betas));
}

// A core status as the op's status, its message prefixed by `op`.
inline ::tensorflow::Status to_tf_status(const Status& s, const char* op) {
  if (s.ok()) return ::tensorflow::Status();
  if (s.code == StatusCode::kInvalidArgument) {
    return ::tensorflow::errors::InvalidArgument(op, ": ", s.message);
  }
  if (s.code == StatusCode::kResourceExhausted) {
    return ::tensorflow::errors::ResourceExhausted(
        op, ": ", s.message,
        ". Use mode='tiled' with a smaller tile_size or memory_budget, or a smaller batch.");
  }
  return ::tensorflow::errors::Internal(op, ": ", s.message);
}

}  // namespace tf_rnnt

#endif  // TF_RNNT_TF_KERNEL_SHARED_H_
