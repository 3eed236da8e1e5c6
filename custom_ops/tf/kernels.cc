// TensorFlow glue: validate with OP_REQUIRES, allocate through TensorFlow, call the
// framework-free core (custom_ops/core) on the op's thread pool or CUDA stream.
#include <algorithm>
#include <cstring>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/threadpool.h"
#include "tf_rnnt/node_math.h"
#include "tf_rnnt/rnnt_core.h"

#if TF_RNNT_WITH_CUDA
#include "xla/stream_executor/stream.h"
#endif

namespace tf_rnnt {

using ::tensorflow::AllocatorAttributes;
using ::tensorflow::DataType;
using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::errors::Internal;
using ::tensorflow::errors::ResourceExhausted;

namespace {

// OP_REQUIRES for helpers that return false on failure.
#define TF_RNNT_REQUIRE(ctx, cond, ret, status)   \
  do {                                            \
    if (!(cond)) {                                \
      (ctx)->CtxFailure(__FILE__, __LINE__, status); \
      return ret;                                 \
    }                                             \
  } while (0)

// Default bytes for one tile's workspace. The GPU needs large tiles for efficient GEMMs; the CPU
// does not, and TensorFlow's CPU allocator keeps freed blocks, so its budget stays small.
constexpr int64_t kDefaultGpuMemoryBudget = 256LL << 20;
constexpr int64_t kDefaultCpuMemoryBudget = 64LL << 20;

ParallelFor cpu_parallel_for(OpKernelContext* ctx) {
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  return [workers](int64_t total, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) {
    workers->ParallelFor(total, cost, fn);
  };
}

void* gpu_stream(OpKernelContext* ctx) {
#if TF_RNNT_WITH_CUDA
  return ctx->op_device_context()->stream()->platform_specific_handle().stream;
#else
  (void)ctx;
  return nullptr;
#endif
}

::tensorflow::Status to_tf_status(const Status& s, const char* op) {
  if (s.ok()) return ::tensorflow::Status();
  if (s.code == StatusCode::kInvalidArgument) return InvalidArgument(op, ": ", s.message);
  if (s.code == StatusCode::kResourceExhausted) {
    return ResourceExhausted(op, ": ", s.message,
                             ". Use mode='tiled' with a smaller tile_size or memory_budget, or a "
                             "smaller batch.");
  }
  return Internal(op, ": ", s.message);
}

DType core_dtype(DataType dt) {
  switch (dt) {
    case ::tensorflow::DT_HALF:
      return DType::kFloat16;
    case ::tensorflow::DT_BFLOAT16:
      return DType::kBFloat16;
    default:
      return DType::kFloat32;
  }
}

// logit_lengths in [1, T], label_lengths in [0, U], both [B].
bool validate_lengths(OpKernelContext* ctx, const Tensor& logit_lengths, const Tensor& label_lengths,
                      int64_t B, int64_t T, int64_t U1) {
  TF_RNNT_REQUIRE(ctx, logit_lengths.dims() == 1 && logit_lengths.dim_size(0) == B, false,
                     InvalidArgument("logit_lengths must have shape [", B, "] (the batch size), got ",
                                     logit_lengths.shape().DebugString()));
  TF_RNNT_REQUIRE(ctx, label_lengths.dims() == 1 && label_lengths.dim_size(0) == B, false,
                     InvalidArgument("label_lengths must have shape [", B, "] (the batch size), got ",
                                     label_lengths.shape().DebugString()));
  const auto logit = logit_lengths.flat<int32_t>();
  const auto label = label_lengths.flat<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    TF_RNNT_REQUIRE(ctx, logit(b) >= 1 && logit(b) <= T, false,
                       InvalidArgument("logit_lengths[", b, "] = ", logit(b), " must be in [1, ", T,
                                       "] (T, the padded number of frames)"));
    TF_RNNT_REQUIRE(ctx, label(b) >= 0 && label(b) <= U1 - 1, false,
                       InvalidArgument("label_lengths[", b, "] = ", label(b), " must be in [0, ",
                                       U1 - 1, "] (U, the padded number of labels)"));
  }
  return true;
}

// labels[b, u] for u < label_lengths[b] in [0, V) and != blank.
bool validate_labels(OpKernelContext* ctx, const Tensor& labels, const Tensor& label_lengths,
                     int64_t V, int blank) {
  const auto lab = labels.matrix<int32_t>();
  const auto len = label_lengths.flat<int32_t>();
  for (int64_t b = 0; b < labels.dim_size(0); ++b) {
    for (int64_t u = 0; u < len(b); ++u) {
      const int32_t y = lab(b, u);
      TF_RNNT_REQUIRE(ctx, y >= 0 && y < V, false,
                         InvalidArgument("labels[", b, ", ", u, "] = ", y, " must be in [0, ", V,
                                         ") (V, the vocabulary size)"));
      TF_RNNT_REQUIRE(ctx, y != blank, false,
                         InvalidArgument("labels[", b, ", ", u, "] = ", y,
                                         " is the blank index; labels must not contain blank"));
    }
  }
  return true;
}

bool normalize_blank(OpKernelContext* ctx, int blank_attr, int64_t V, int* blank) {
  *blank = blank_attr < 0 ? static_cast<int>(blank_attr + V) : blank_attr;
  TF_RNNT_REQUIRE(ctx, *blank >= 0 && *blank < V, false,
                     InvalidArgument("blank = ", blank_attr, " must be in [-", V, ", ", V,
                                     ") (V, the vocabulary size)"));
  return true;
}

// ------------------------------------------------------------------ lattice loss
template <bool kGpu>
class LatticeLossOp : public OpKernel {
 public:
  explicit LatticeLossOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("fastemit_lambda", &options_.fastemit_lambda));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("clamp", &options_.clamp));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& lattice = ctx->input(0);
    OP_REQUIRES(ctx, lattice.dims() == 4 && lattice.dim_size(3) == 2,
                InvalidArgument("lattice must have shape [B, T, U+1, 2], got ",
                                lattice.shape().DebugString()));
    const int64_t B = lattice.dim_size(0), T = lattice.dim_size(1), U1 = lattice.dim_size(2);
    if (!validate_lengths(ctx, ctx->input(3), ctx->input(4), B, T, U1)) return;
    Tensor* costs = nullptr;
    Tensor* grads = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({B}), &costs));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, lattice.shape(), &grads));
    if (B == 0) return;
    Tensor alphas, betas;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({B, T, U1}), &alphas));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({B, T, U1}), &betas));
    const int lengths_index = kGpu ? 1 : 3;  // device copies on the GPU, host copies on the CPU
    const auto* logit_lengths = ctx->input(lengths_index).flat<int32_t>().data();
    const auto* label_lengths = ctx->input(lengths_index + 1).flat<int32_t>().data();
    Status s;
    if (kGpu) {
      s = lattice_loss_cuda(lattice.flat<float>().data(), logit_lengths, label_lengths, B, T, U1,
                            options_, costs->flat<float>().data(), grads->flat<float>().data(),
                            alphas.flat<float>().data(), betas.flat<float>().data(),
                            gpu_stream(ctx));
    } else {
      s = lattice_loss_cpu(lattice.flat<float>().data(), logit_lengths, label_lengths, B, T, U1,
                           options_, costs->flat<float>().data(), grads->flat<float>().data(),
                           alphas.flat<float>().data(), betas.flat<float>().data(),
                           cpu_parallel_for(ctx));
    }
    OP_REQUIRES_OK(ctx, to_tf_status(s, "lattice_loss"));
  }

 private:
  LatticeLossOptions options_;
};

// ------------------------------------------------------------------ logits -> lattice
template <bool kGpu>
class LogitsToLatticeOp : public OpKernel {
 public:
  explicit LogitsToLatticeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("blank", &blank_attr_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("validate_labels", &validate_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& logits = ctx->input(0);
    const Tensor& labels = ctx->input(1);
    OP_REQUIRES(ctx, logits.dims() == 4,
                InvalidArgument("logits must have shape [B, T, U+1, V], got ",
                                logits.shape().DebugString()));
    const int64_t B = logits.dim_size(0), T = logits.dim_size(1), U1 = logits.dim_size(2),
                  V = logits.dim_size(3);
    OP_REQUIRES(ctx, labels.dims() == 2 && labels.dim_size(0) == B && labels.dim_size(1) == U1 - 1,
                InvalidArgument("labels must have shape [", B, ", ", U1 - 1,
                                "] ([B, U] for logits of shape ", logits.shape().DebugString(),
                                "), got ", labels.shape().DebugString()));
    OP_REQUIRES(ctx, V > 0, InvalidArgument("logits must have a non-empty vocabulary axis"));
    int blank;
    if (!normalize_blank(ctx, blank_attr_, V, &blank)) return;
    if (validate_) {
      const Tensor& lengths = ctx->input(3);
      OP_REQUIRES(ctx, lengths.dims() == 1 && lengths.dim_size(0) == B,
                  InvalidArgument("label_lengths must have shape [", B, "], got ",
                                  lengths.shape().DebugString()));
      const auto len = lengths.flat<int32_t>();
      for (int64_t b = 0; b < B; ++b) {
        OP_REQUIRES(ctx, len(b) >= 0 && len(b) <= U1 - 1,
                    InvalidArgument("label_lengths[", b, "] = ", len(b), " must be in [0, ", U1 - 1,
                                    "] (U, the padded number of labels)"));
      }
      if (!validate_labels(ctx, ctx->input(2), lengths, V, blank)) return;
    }
    Tensor* lattice = nullptr;
    Tensor* lse = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({B, T, U1, 2}), &lattice));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({B, T, U1}), &lse));
    const DType dtype = core_dtype(logits.dtype());
    const void* data = logits.tensor_data().data();
    Status s;
    if (kGpu) {
      s = logits_to_lattice_cuda(data, dtype, labels.flat<int32_t>().data(), B, T, U1, V, blank,
                                 lattice->flat<float>().data(), lse->flat<float>().data(),
                                 gpu_stream(ctx));
    } else {
      s = logits_to_lattice_cpu(data, dtype, labels.flat<int32_t>().data(), B, T, U1, V, blank,
                                lattice->flat<float>().data(), lse->flat<float>().data(),
                                cpu_parallel_for(ctx));
    }
    OP_REQUIRES_OK(ctx, to_tf_status(s, "logits_to_lattice"));
  }

 private:
  int blank_attr_;
  bool validate_;
};

template <bool kGpu>
class LogitsToLatticeGradOp : public OpKernel {
 public:
  explicit LogitsToLatticeGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("blank", &blank_attr_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& logits = ctx->input(0);
    const int64_t B = logits.dim_size(0), T = logits.dim_size(1), U1 = logits.dim_size(2),
                  V = logits.dim_size(3);
    int blank;
    if (!normalize_blank(ctx, blank_attr_, V, &blank)) return;
    OP_REQUIRES(ctx, ctx->input(3).NumElements() == B * T * U1 * 2,
                InvalidArgument("d_lattice must have shape [B, T, U+1, 2]"));
    // d logits overwrites the logits' buffer when TensorFlow can forward it.
    Tensor* d_logits = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, logits.shape(), &d_logits));
    const DType dtype = core_dtype(logits.dtype());
    Status s;
    if (kGpu) {
      s = logits_to_lattice_grad_cuda(logits.tensor_data().data(), dtype,
                                      ctx->input(1).flat<int32_t>().data(), B, T, U1, V, blank,
                                      ctx->input(2).flat<float>().data(),
                                      ctx->input(3).flat<float>().data(),
                                      const_cast<char*>(d_logits->tensor_data().data()),
                                      gpu_stream(ctx));
    } else {
      s = logits_to_lattice_grad_cpu(logits.tensor_data().data(), dtype,
                                     ctx->input(1).flat<int32_t>().data(), B, T, U1, V, blank,
                                     ctx->input(2).flat<float>().data(),
                                     ctx->input(3).flat<float>().data(),
                                     const_cast<char*>(d_logits->tensor_data().data()),
                                     cpu_parallel_for(ctx));
    }
    OP_REQUIRES_OK(ctx, to_tf_status(s, "logits_to_lattice gradient"));
  }

 private:
  int blank_attr_;
};

// ------------------------------------------------------------------ fused joint
struct JointAttrs {
  int blank_attr = 0;
  int activation = kTanh;
  bool untiled = false;
  int64_t tile_nodes = 0;
  int64_t memory_budget = 0;
  bool allow_tf32 = true;

  explicit JointAttrs(OpKernelConstruction* ctx) {
    std::string act;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("blank", &blank_attr));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("activation", &act));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("untiled", &untiled));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tile_nodes", &tile_nodes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("memory_budget", &memory_budget));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("allow_tf32", &allow_tf32));
    activation = act == "relu" ? kRelu : act == "identity" ? kIdentity : kTanh;
  }
};

// Shapes, validation and the packed-node plan shared by the forward and backward kernels.
struct JointPlan {
  JointShape shape;
  int64_t num_nodes = 0;
  std::vector<int64_t> host_offsets;

  bool init(OpKernelContext* ctx, const JointAttrs& attrs, const Tensor& logit_lengths_host,
            const Tensor& label_lengths_host) {
    const Tensor& enc = ctx->input(0);
    const Tensor& pred = ctx->input(1);
    const Tensor& kernel = ctx->input(2);
    const Tensor& bias = ctx->input(3);
    const Tensor& labels = ctx->input(4);
    TF_RNNT_REQUIRE(ctx, enc.dims() == 3, false,
                       InvalidArgument("encoder must have shape [B, T, H], got ",
                                       enc.shape().DebugString()));
    const int64_t B = enc.dim_size(0), T = enc.dim_size(1), H = enc.dim_size(2);
    TF_RNNT_REQUIRE(ctx, pred.dims() == 3 && pred.dim_size(0) == B && pred.dim_size(2) == H,
                       false,
                       InvalidArgument("predictor must have shape [", B, ", U+1, ", H,
                                       "] (batch and H of encoder ", enc.shape().DebugString(),
                                       "), got ", pred.shape().DebugString()));
    const int64_t U1 = pred.dim_size(1);
    TF_RNNT_REQUIRE(ctx, U1 >= 1, false, InvalidArgument("predictor must have U+1 >= 1 steps"));
    TF_RNNT_REQUIRE(ctx, kernel.dims() == 2 && kernel.dim_size(0) == H, false,
                       InvalidArgument("kernel must have shape [", H, ", V] (H of encoder ",
                                       enc.shape().DebugString(), "), got ",
                                       kernel.shape().DebugString()));
    const int64_t V = kernel.dim_size(1);
    TF_RNNT_REQUIRE(ctx, V >= 1, false, InvalidArgument("kernel must have V >= 1 columns"));
    TF_RNNT_REQUIRE(ctx, bias.dims() == 1 && bias.dim_size(0) == V, false,
                       InvalidArgument("bias must have shape [", V, "] (V of kernel ",
                                       kernel.shape().DebugString(), "), got ",
                                       bias.shape().DebugString()));
    TF_RNNT_REQUIRE(ctx, labels.dims() == 2 && labels.dim_size(0) == B && labels.dim_size(1) == U1 - 1,
                       false,
                       InvalidArgument("labels must have shape [", B, ", ", U1 - 1,
                                       "] ([B, U] for predictor ", pred.shape().DebugString(),
                                       "), got ", labels.shape().DebugString()));
    if (!validate_lengths(ctx, logit_lengths_host, label_lengths_host, B, T, U1)) return false;
    shape.B = static_cast<int>(B);
    shape.T = static_cast<int>(T);
    shape.U1 = static_cast<int>(U1);
    shape.H = static_cast<int>(H);
    shape.V = static_cast<int>(V);
    if (!normalize_blank(ctx, attrs.blank_attr, V, &shape.blank)) return false;
    shape.activation = attrs.activation;
    shape.dtype = core_dtype(enc.dtype());
    shape.allow_tf32 = attrs.allow_tf32;
    host_offsets.resize(B + 1);
    joint_node_offsets(logit_lengths_host.flat<int32_t>().data(),
                       label_lengths_host.flat<int32_t>().data(), shape.B, host_offsets.data());
    num_nodes = host_offsets[B];
    return true;
  }

  // Tile size: the attribute, else as many nodes as fit memory_budget (default 256 MiB).
  int64_t tile_nodes(const JointAttrs& attrs, bool gpu) const {
    if (attrs.untiled || num_nodes == 0) return std::max<int64_t>(num_nodes, 1);
    if (attrs.tile_nodes > 0) return std::min(attrs.tile_nodes, num_nodes);
    const int64_t budget = attrs.memory_budget > 0 ? attrs.memory_budget
                           : gpu                   ? kDefaultGpuMemoryBudget
                                                   : kDefaultCpuMemoryBudget;
    // Marginal bytes per node (the workspace also holds tile-independent buffers).
    auto bytes = [&](int64_t nodes) {
      return static_cast<int64_t>(gpu ? joint_workspace_bytes_cuda(shape, nodes, true, false)
                                      : joint_workspace_bytes_cpu(shape, nodes, true, false));
    };
    const int64_t per_node = (bytes(2048) - bytes(1024)) / 1024;
    return std::max<int64_t>(1, std::min(num_nodes, budget / std::max<int64_t>(per_node, 1)));
  }

  // Allocates the workspace, halving the tile while the allocation fails.
  bool allocate_workspace(OpKernelContext* ctx, const JointAttrs& attrs, bool gpu, bool backward,
                          int64_t* tile, Tensor* workspace) const {
    for (;;) {
      const size_t bytes = gpu ? joint_workspace_bytes_cuda(shape, *tile, backward, attrs.untiled)
                               : joint_workspace_bytes_cpu(shape, *tile, backward, attrs.untiled);
      // No retry: a failed allocation makes us halve the tile instead of waiting.
      ::tensorflow::AllocationAttributes no_retry(false, true, nullptr);
      const auto status = ctx->allocate_temp(
          ::tensorflow::DT_INT8, TensorShape({static_cast<int64_t>(std::max<size_t>(bytes, 1))}),
          workspace, AllocatorAttributes(), no_retry);
      if (status.ok()) return true;
      TF_RNNT_REQUIRE(ctx, !attrs.untiled && *tile > 1024, false,
                         ResourceExhausted(
                             "tf_rnnt.joint_lattice could not allocate its ", bytes,
                             "-byte workspace (", *tile, " lattice nodes per tile",
                             attrs.untiled ? ", untiled mode" : "",
                             "). Use mode='tiled' with a smaller tile_size or memory_budget, or a "
                             "smaller batch."));
      *tile /= 2;
    }
  }
};

Status offsets_on_device(OpKernelContext* ctx, const JointPlan& plan, bool gpu, int lengths_index,
                         Tensor* offsets_tensor, const int64_t** offsets) {
  if (!gpu) {
    *offsets = plan.host_offsets.data();
    return Status();
  }
  Status s;
  auto st = ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({plan.shape.B + 1}),
                               offsets_tensor);
  if (!st.ok()) {
    s.code = StatusCode::kCudaError;
    s.message = "could not allocate node offsets";
    return s;
  }
  s = joint_node_offsets_cuda(ctx->input(lengths_index).flat<int32_t>().data(),
                              ctx->input(lengths_index + 1).flat<int32_t>().data(), plan.shape.B,
                              offsets_tensor->flat<int64_t>().data(), gpu_stream(ctx));
  *offsets = offsets_tensor->flat<int64_t>().data();
  return s;
}

// Workspace, packed offsets and the inputs both passes share; false (with the context's status
// set) on failure. host_lengths_index: the lengths' host copies (used by the CPU kernels).
template <typename Args>
bool prepare_joint_args(OpKernelContext* ctx, const JointPlan& plan, const JointAttrs& attrs,
                        bool gpu, bool backward, int host_lengths_index, Tensor* workspace,
                        Tensor* offsets, Args* a) {
  int64_t tile = plan.tile_nodes(attrs, gpu);
  if (!plan.allocate_workspace(ctx, attrs, gpu, backward, &tile, workspace)) return false;
  const Status s = offsets_on_device(ctx, plan, gpu, 5, offsets, &a->node_offsets);
  TF_RNNT_REQUIRE(ctx, s.ok(), false, to_tf_status(s, "joint_lattice"));
  const int lengths_index = gpu ? 5 : host_lengths_index;
  a->logit_lengths = ctx->input(lengths_index).flat<int32_t>().data();
  a->label_lengths = ctx->input(lengths_index + 1).flat<int32_t>().data();
  a->encoder = ctx->input(0).tensor_data().data();
  a->predictor = ctx->input(1).tensor_data().data();
  a->kernel = ctx->input(2).tensor_data().data();
  a->bias = ctx->input(3).tensor_data().data();
  a->labels = ctx->input(4).flat<int32_t>().data();
  a->host_node_offsets = plan.host_offsets.data();
  a->host_logit_lengths = ctx->input(host_lengths_index).flat<int32_t>().data();
  a->host_label_lengths = ctx->input(host_lengths_index + 1).flat<int32_t>().data();
  a->num_nodes = plan.num_nodes;
  a->tile_nodes = tile;
  a->workspace = const_cast<char*>(workspace->tensor_data().data());
  return true;
}

template <bool kGpu>
class JointLatticeOp : public OpKernel {
 public:
  explicit JointLatticeOp(OpKernelConstruction* ctx) : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    JointPlan plan;
    if (!plan.init(ctx, attrs_, ctx->input(8), ctx->input(9))) return;
    const JointShape& s = plan.shape;
    if (!validate_labels(ctx, ctx->input(7), ctx->input(9), s.V, s.blank)) return;
    Tensor* lattice = nullptr;
    Tensor* lse = nullptr;
    Tensor* saved_hidden = nullptr;
    Tensor* saved_logits = nullptr;
    const int64_t N = plan.num_nodes;
    const int64_t kept = attrs_.untiled ? N : 0;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({s.B, s.T, s.U1, 2}), &lattice));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({N}), &lse));
    // Untiled mode keeps [N, H] joint values and [N, V] logits: say what to change if they don't fit.
    for (int i : {2, 3}) {
      const int64_t width = i == 2 ? joint_hidden_width(s, kGpu) : joint_logits_width(s, kGpu);
      const auto st = ctx->allocate_output(i, TensorShape({kept, width}),
                                           i == 2 ? &saved_hidden : &saved_logits);
      OP_REQUIRES(ctx, st.ok(),
                  ResourceExhausted("tf_rnnt.joint_lattice (mode='untiled') could not keep the ",
                                    kept, " x ", width, (i == 2 ? " joint values" : " logits"),
                                    " of its ", kept, " lattice nodes. Use mode='tiled' (with "
                                    "tile_size or memory_budget), or a smaller batch. (",
                                    st.message(), ")"));
    }
    if (s.B == 0) return;
    Tensor workspace, offsets;
    JointForwardArgs a;
    if (!prepare_joint_args(ctx, plan, attrs_, kGpu, false, 8, &workspace, &offsets, &a)) return;
    a.lattice = lattice->flat<float>().data();
    a.lse = lse->flat<float>().data();
    a.saved_hidden = attrs_.untiled ? const_cast<char*>(saved_hidden->tensor_data().data()) : nullptr;
    a.saved_logits = attrs_.untiled ? saved_logits->flat<float>().data() : nullptr;
    const Status st = kGpu ? joint_forward_cuda(s, a, gpu_stream(ctx))
                           : joint_forward_cpu(s, a, cpu_parallel_for(ctx));
    OP_REQUIRES_OK(ctx, to_tf_status(st, "joint_lattice"));
  }

 private:
  JointAttrs attrs_;
};

template <bool kGpu>
class JointLatticeGradOp : public OpKernel {
 public:
  explicit JointLatticeGradOp(OpKernelConstruction* ctx) : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    JointPlan plan;
    if (!plan.init(ctx, attrs_, ctx->input(7), ctx->input(8))) return;
    const JointShape& s = plan.shape;
    const int64_t N = plan.num_nodes;
    Tensor* outputs[4];
    for (int i = 0; i < 4; ++i) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, ctx->input(i).shape(), &outputs[i]));
    }
    // float32 accumulators: the outputs themselves for float32 inputs.
    const bool float_io = s.dtype == DType::kFloat32;
    Tensor acc[4];
    float* acc_ptr[4];
    for (int i = 0; i < 4; ++i) {
      if (float_io) {
        acc_ptr[i] = outputs[i]->flat<float>().data();
      } else {
        OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, ctx->input(i).shape(), &acc[i]));
        acc_ptr[i] = acc[i].flat<float>().data();
      }
    }
    // An empty batch still runs the launcher, which zeroes d kernel and d bias.
    OP_REQUIRES(ctx, ctx->input(9).NumElements() == N,
                InvalidArgument("lse must have ", N, " elements"));
    Tensor saved_logits;
    float* saved_logits_ptr = nullptr;
    if (attrs_.untiled) {
      // d logits overwrites the kept logits when TensorFlow can forward that buffer.
      const Tensor& kept = ctx->input(12);
      const int64_t width = joint_logits_width(s, kGpu);
      OP_REQUIRES(ctx, kept.NumElements() == N * width,
                  InvalidArgument("saved_logits must have shape [", N, ", ", width, "]"));
      std::unique_ptr<Tensor> forwarded = ctx->forward_input(
          12, OpKernelContext::Params::kNoReservation, ::tensorflow::DT_FLOAT, kept.shape(),
          ::tensorflow::DEVICE_MEMORY, AllocatorAttributes());
      if (forwarded) {
        saved_logits = *forwarded;
      } else {
        // Shared buffer (for example a persistent tape): overwrite a private copy instead.
        OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, kept.shape(), &saved_logits));
        const size_t bytes = kept.TotalBytes();
        if (kGpu) {
          OP_REQUIRES_OK(ctx, to_tf_status(copy_cuda(saved_logits.flat<float>().data(),
                                                     kept.flat<float>().data(), bytes,
                                                     gpu_stream(ctx)),
                                           "joint_lattice gradient"));
        } else {
          std::memcpy(saved_logits.flat<float>().data(), kept.flat<float>().data(), bytes);
        }
      }
      saved_logits_ptr = saved_logits.flat<float>().data();
    }
    Tensor workspace, offsets;
    JointBackwardArgs a;
    if (!prepare_joint_args(ctx, plan, attrs_, kGpu, true, 7, &workspace, &offsets, &a)) return;
    a.lse = ctx->input(9).flat<float>().data();
    a.d_lattice = ctx->input(10).flat<float>().data();
    a.saved_hidden = attrs_.untiled ? ctx->input(11).tensor_data().data() : nullptr;
    a.saved_logits = saved_logits_ptr;
    a.d_encoder = acc_ptr[0];
    a.d_predictor = acc_ptr[1];
    a.d_kernel = acc_ptr[2];
    a.d_bias = acc_ptr[3];
    Status st = kGpu ? joint_backward_cuda(s, a, gpu_stream(ctx))
                     : joint_backward_cpu(s, a, cpu_parallel_for(ctx));
    OP_REQUIRES_OK(ctx, to_tf_status(st, "joint_lattice gradient"));
    if (float_io) return;
    for (int i = 0; i < 4; ++i) {
      const int64_t n = outputs[i]->NumElements();
      void* out = const_cast<char*>(outputs[i]->tensor_data().data());
      if (kGpu) {
        st = cast_float_cuda(acc_ptr[i], out, s.dtype, n, gpu_stream(ctx));
        OP_REQUIRES_OK(ctx, to_tf_status(st, "joint_lattice gradient"));
      } else {
        auto* bits = static_cast<uint16_t*>(out);
        const bool half = s.dtype == DType::kFloat16;
        for (int64_t j = 0; j < n; ++j) {
          bits[j] = half ? float_to_half_bits(acc_ptr[i][j]) : float_to_bf16_bits(acc_ptr[i][j]);
        }
      }
    }
  }

 private:
  JointAttrs attrs_;
};

}  // namespace

#define REGISTER_FLOAT_KERNELS(NAME, OP, DEVICE, GPU, ...)                                 \
  REGISTER_KERNEL_BUILDER(Name(NAME).Device(DEVICE).TypeConstraint<float>("dtype") __VA_ARGS__, \
                          OP<GPU>);                                                        \
  REGISTER_KERNEL_BUILDER(                                                                 \
      Name(NAME).Device(DEVICE).TypeConstraint<::Eigen::half>("dtype") __VA_ARGS__, OP<GPU>); \
  REGISTER_KERNEL_BUILDER(                                                                 \
      Name(NAME).Device(DEVICE).TypeConstraint<::tensorflow::bfloat16>("dtype") __VA_ARGS__, OP<GPU>);

REGISTER_KERNEL_BUILDER(Name("TfRnntLatticeLoss").Device(DEVICE_CPU), LatticeLossOp<false>);
REGISTER_FLOAT_KERNELS("TfRnntLogitsToLattice", LogitsToLatticeOp, DEVICE_CPU, false)
REGISTER_FLOAT_KERNELS("TfRnntLogitsToLatticeGrad", LogitsToLatticeGradOp, DEVICE_CPU, false)
REGISTER_FLOAT_KERNELS("TfRnntJointLattice", JointLatticeOp, DEVICE_CPU, false)
REGISTER_FLOAT_KERNELS("TfRnntJointLatticeGrad", JointLatticeGradOp, DEVICE_CPU, false)

#if TF_RNNT_WITH_CUDA
using ::tensorflow::DEVICE_GPU;
REGISTER_KERNEL_BUILDER(Name("TfRnntLatticeLoss")
                            .Device(DEVICE_GPU)
                            .HostMemory("logit_lengths_host")
                            .HostMemory("label_lengths_host"),
                        LatticeLossOp<true>);
REGISTER_FLOAT_KERNELS("TfRnntLogitsToLattice", LogitsToLatticeOp, DEVICE_GPU, true,
                       .HostMemory("labels_host").HostMemory("label_lengths_host"))
REGISTER_FLOAT_KERNELS("TfRnntLogitsToLatticeGrad", LogitsToLatticeGradOp, DEVICE_GPU, true)
REGISTER_FLOAT_KERNELS("TfRnntJointLattice", JointLatticeOp, DEVICE_GPU, true,
                       .HostMemory("labels_host")
                           .HostMemory("logit_lengths_host")
                           .HostMemory("label_lengths_host"))
REGISTER_FLOAT_KERNELS("TfRnntJointLatticeGrad", JointLatticeGradOp, DEVICE_GPU, true,
                       .HostMemory("logit_lengths_host").HostMemory("label_lengths_host"))
#endif

}  // namespace tf_rnnt
