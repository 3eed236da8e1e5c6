// XLA support: each op (and gradient op) lowers to an XLA custom call ("typed FFI" API) whose
// handlers, registered below for the Host and CUDA platforms, call the same core launchers as
// the TensorFlow kernels. The kernels are registered for the XLA_CPU_JIT / XLA_GPU_JIT devices
// directly in TensorFlow's kernel registry (not through XlaOpRegistry, whose kernels are only
// registered once per process and would miss a library loaded after the first compilation).
//
// Under XLA every buffer has a static shape: the joint's packed log-sum-exp gets B * T * U1
// entries (the first num_nodes are used), and it always runs tiled (mode="untiled" keeps
// nothing). Workspaces are an extra u8 result of each custom call, so XLA allocates them with
// its other buffers (its GPU scratch allocator refuses even small requests); the joint's is
// sized for all B * T * U1 nodes valid, an upper bound of the tile the handler plans. Lengths
// and labels are validated on the host; on the GPU they are copied to the host on the op's
// stream, which synchronizes it (the joint also needs the host lengths to plan its tiles).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernel_shared.h"
#include "op_inputs.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/core/framework/kernel_def_builder.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/types.h"
#include "tf_rnnt/rnnt_core.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"
#include "xla/hlo/builder/xla_builder.h"
#include "xla/shape_util.h"

#if TF_RNNT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

extern "C" const XLA_FFI_Api* XLA_FFI_GetApi();

namespace tf_rnnt {
namespace {

namespace ffi = ::xla::ffi;
using ::tensorflow::XlaOpKernel;
using ::tensorflow::XlaOpKernelContext;
using ::tensorflow::errors::InvalidArgument;

size_t joint_workspace_bytes(const JointShape& shape, const JointOptions& options,
                             int64_t tile_nodes, bool backward, bool gpu) {
  return gpu ? joint_workspace_bytes_cuda(shape, options, tile_nodes, backward, false)
             : joint_workspace_bytes_cpu(shape, options, tile_nodes, backward, false);
}

// Nodes per tile; never more for fewer num_nodes, so the lowering sizes the workspace with all
// nodes valid.
int64_t tile_nodes_for(const JointShape& shape, const JointOptions& options, int64_t num_nodes,
                       int64_t tile_attr, int64_t budget_attr, bool gpu) {
  return joint_tile_nodes(
      num_nodes, tile_attr, budget_attr, gpu ? kDefaultGpuMemoryBudget : kDefaultCpuMemoryBudget,
      [&](int64_t nodes) { return joint_workspace_bytes(shape, options, nodes, true, gpu); });
}

// ------------------------------------------------------------------ lowering helpers
// An MLIR dictionary attribute, the backend config of a typed-FFI custom call.
class AttrDict {
 public:
  AttrDict& i64(const char* name, int64_t v) { return add(name, std::to_string(v) + " : i64"); }
  AttrDict& f32(const char* name, float v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.9e : f32", static_cast<double>(v));
    return add(name, buf);
  }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  AttrDict& add(const char* name, const std::string& value) {
    if (!body_.empty()) body_ += ", ";
    body_ += std::string(name) + " = " + value;
    return *this;
  }
  std::string body_;
};

// Emits custom call `target` and sets the op's outputs `outputs[i]` to tuple element i.
void emit_custom_call(XlaOpKernelContext* ctx, const char* target,
                      const std::vector<::xla::XlaOp>& operands,
                      const std::vector<::xla::Shape>& results, const AttrDict& attrs,
                      const std::vector<int>& outputs) {
  const ::xla::XlaOp call = ::xla::CustomCall(
      ctx->builder(), target, operands, ::xla::ShapeUtil::MakeTupleShape(results), attrs.str(),
      /*has_side_effect=*/false, /*output_operand_aliasing=*/{}, /*literal=*/nullptr,
      ::xla::CustomCallSchedule::SCHEDULE_NONE, ::xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
  for (size_t i = 0; i < outputs.size(); ++i) {
    ctx->SetOutput(outputs[i], ::xla::GetTupleElement(call, static_cast<int64_t>(i)));
  }
}

bool static_dims(XlaOpKernelContext* ctx, int index, const char* name, int rank,
                 std::vector<int64_t>* dims) {
  auto shape = ctx->InputXlaShape(index);
  if (!shape.ok()) {
    ctx->CtxFailure(shape.status());
    return false;
  }
  if (shape->dimensions().size() != rank || !shape->is_static()) {
    ctx->CtxFailure(InvalidArgument(name, " must have a static shape of rank ", rank,
                                    " under XLA, got ", shape->ToString()));
    return false;
  }
  dims->assign(shape->dimensions().begin(), shape->dimensions().end());
  return true;
}

::xla::PrimitiveType xla_type(::tensorflow::DataType dt) {
  switch (dt) {
    case ::tensorflow::DT_HALF:
      return ::xla::F16;
    case ::tensorflow::DT_BFLOAT16:
      return ::xla::BF16;
    default:
      return ::xla::F32;
  }
}

// A custom call's workspace result (at least one byte, so it always has an address).
::xla::Shape workspace_shape(size_t bytes) {
  return ::xla::ShapeUtil::MakeShape(::xla::U8, {std::max<int64_t>(1, bytes)});
}

bool on_gpu(::tensorflow::OpKernelConstruction* ctx) {
  return ctx->device_type() == ::tensorflow::DeviceType(::tensorflow::DEVICE_GPU_XLA_JIT);
}

// ------------------------------------------------------------------ XLA op kernels
class LatticeLossXla : public XlaOpKernel {
 public:
  explicit LatticeLossXla(::tensorflow::OpKernelConstruction* ctx) : XlaOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("fastemit_lambda", &fastemit_lambda_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("clamp", &clamp_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    std::vector<int64_t> d;
    using namespace lattice_loss_in;  // NOLINT: the input names
    if (!static_dims(ctx, kLattice, "lattice", 4, &d)) return;
    const auto f32 = [](std::vector<int64_t> dims) {
      return ::xla::ShapeUtil::MakeShape(::xla::F32, dims);
    };
    // Workspace: alphas and betas, [B, T, U1] each.
    emit_custom_call(ctx, "tf_rnnt_lattice_loss",
                     {ctx->Input(kLattice), ctx->Input(kLogitLengths), ctx->Input(kLabelLengths)},
                     {f32({d[0]}), f32(d), workspace_shape(2 * sizeof(float) * d[0] * d[1] * d[2])},
                     AttrDict().f32("fastemit_lambda", fastemit_lambda_).f32("clamp", clamp_),
                     {0, 1});
  }

 private:
  float fastemit_lambda_ = 0.f, clamp_ = -1.f;
};

class LogitsToLatticeXla : public XlaOpKernel {
 public:
  explicit LogitsToLatticeXla(::tensorflow::OpKernelConstruction* ctx) : XlaOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("blank", &blank_attr_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("validate_labels", &validate_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    using namespace logits_to_lattice_in;  // NOLINT: the input names
    std::vector<int64_t> d;
    if (!static_dims(ctx, kLogits, "logits", 4, &d)) return;
    int64_t blank;
    if (!normalize_blank(ctx, blank_attr_, d[3], &blank)) return;
    const auto f32 = [](std::vector<int64_t> dims) {
      return ::xla::ShapeUtil::MakeShape(::xla::F32, dims);
    };
    // Validation reads the labels and the label lengths; without it, an empty vector.
    emit_custom_call(ctx, "tf_rnnt_logits_to_lattice",
                     {ctx->Input(kLogits), ctx->Input(kLabels), ctx->Input(kLabelLengthsHost)},
                     {f32({d[0], d[1], d[2], 2}), f32({d[0], d[1], d[2]})},
                     AttrDict().i64("blank", blank).i64("validate", validate_ ? 1 : 0), {0, 1});
  }

 private:
  int blank_attr_ = 0;
  bool validate_ = false;
};

class LogitsToLatticeGradXla : public XlaOpKernel {
 public:
  explicit LogitsToLatticeGradXla(::tensorflow::OpKernelConstruction* ctx) : XlaOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("blank", &blank_attr_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    using namespace logits_to_lattice_grad_in;  // NOLINT: the input names
    std::vector<int64_t> d;
    if (!static_dims(ctx, kLogits, "logits", 4, &d)) return;
    int64_t blank;
    if (!normalize_blank(ctx, blank_attr_, d[3], &blank)) return;
    emit_custom_call(
        ctx, "tf_rnnt_logits_to_lattice_grad",
        {ctx->Input(kLogits), ctx->Input(kLabels), ctx->Input(kLse), ctx->Input(kDLattice)},
        {::xla::ShapeUtil::MakeShape(xla_type(ctx->input_type(kLogits)), d)},
        AttrDict().i64("blank", blank), {0});
  }

 private:
  int blank_attr_ = 0;
};

// The joint's attributes (untiled is ignored: under XLA the joint always runs tiled).
struct JointXlaAttrs : JointAttrs {
  using JointAttrs::JointAttrs;

  // [B, T, H], [B, U1, H], [H, V], [V], [B, U]: checks and returns B, T, U1, H, V and blank.
  bool dims(XlaOpKernelContext* ctx, std::vector<int64_t>* enc, std::vector<int64_t>* pred,
            std::vector<int64_t>* kernel, int64_t* blank) const {
    using namespace joint_in;  // NOLINT: the input names
    std::vector<int64_t> bias, labels;
    if (!static_dims(ctx, kEncoder, "encoder", 3, enc) ||
        !static_dims(ctx, kPredictor, "predictor", 3, pred) ||
        !static_dims(ctx, kKernel, "kernel", 2, kernel) ||
        !static_dims(ctx, kBias, "bias", 1, &bias) ||
        !static_dims(ctx, kLabels, "labels", 2, &labels)) {
      return false;
    }
    const int64_t B = (*enc)[0], H = (*enc)[2], U1 = (*pred)[1], V = (*kernel)[1];
    if ((*pred)[0] != B || (*pred)[2] != H || (*kernel)[0] != H || bias[0] != V || labels[0] != B ||
        labels[1] != U1 - 1 || U1 < 1 || V < 1) {
      ctx->CtxFailure(InvalidArgument(
          "joint_lattice: inconsistent shapes: encoder [B, T, H], predictor [B, U+1, H], kernel "
          "[H, V], bias [V] and labels [B, U] expected"));
      return false;
    }
    return normalize_blank(ctx, blank_attr, V, blank);
  }

  AttrDict dict(int64_t blank) const {
    return AttrDict()
        .i64("blank", blank)
        .i64("activation", static_cast<int64_t>(activation))
        .i64("tile_nodes", tile_nodes)
        .i64("memory_budget", memory_budget)
        .i64("allow_tf32", allow_tf32 ? 1 : 0);
  }

  // The workspace for the handler's largest plan: every node valid.
  ::xla::Shape workspace(const std::vector<int64_t>& enc, const std::vector<int64_t>& pred,
                         const std::vector<int64_t>& kernel, ::tensorflow::DataType dtype,
                         int64_t blank, bool backward, bool gpu) const {
    JointShape s;
    s.B = static_cast<int>(enc[0]);
    s.T = static_cast<int>(enc[1]);
    s.H = static_cast<int>(enc[2]);
    s.U1 = static_cast<int>(pred[1]);
    s.V = static_cast<int>(kernel[1]);
    JointOptions o;
    o.blank = static_cast<int>(blank);
    o.activation = activation;
    o.dtype = dtype == ::tensorflow::DT_HALF       ? DType::kFloat16
              : dtype == ::tensorflow::DT_BFLOAT16 ? DType::kBFloat16
                                                   : DType::kFloat32;
    o.allow_tf32 = allow_tf32;
    const int64_t tile =
        tile_nodes_for(s, o, enc[0] * enc[1] * pred[1], tile_nodes, memory_budget, gpu);
    return workspace_shape(joint_workspace_bytes(s, o, tile, backward, gpu));
  }
};

// The first operands of both joint custom calls: encoder .. label_lengths (joint_in).
std::vector<::xla::XlaOp> joint_operands(XlaOpKernelContext* ctx) {
  std::vector<::xla::XlaOp> operands;
  for (int i = joint_in::kEncoder; i <= joint_in::kLabelLengths; ++i) {
    operands.push_back(ctx->Input(i));
  }
  return operands;
}

class JointLatticeXla : public XlaOpKernel {
 public:
  explicit JointLatticeXla(::tensorflow::OpKernelConstruction* ctx)
      : XlaOpKernel(ctx), attrs_(ctx), gpu_(on_gpu(ctx)) {}

  void Compile(XlaOpKernelContext* ctx) override {
    std::vector<int64_t> enc, pred, kernel;
    int64_t blank;
    if (!attrs_.dims(ctx, &enc, &pred, &kernel, &blank)) return;
    const int64_t B = enc[0], T = enc[1], U1 = pred[1];
    emit_custom_call(ctx, "tf_rnnt_joint_lattice", joint_operands(ctx),
                     {::xla::ShapeUtil::MakeShape(::xla::F32, {B, T, U1, 2}),
                      ::xla::ShapeUtil::MakeShape(::xla::F32, {B * T * U1}),
                      attrs_.workspace(enc, pred, kernel, ctx->input_type(joint_in::kEncoder),
                                       blank, false, gpu_)},
                     attrs_.dict(blank), {0, 1});
    // Nothing is kept for the backward pass beyond the log-sum-exp: empty saved buffers.
    const ::xla::XlaOp zero = ::xla::ConstantR0<float>(ctx->builder(), 0.f);
    ctx->SetOutput(2, ::xla::Broadcast(::xla::ConvertElementType(
                                           zero, xla_type(ctx->input_type(joint_in::kEncoder))),
                                       {0}));
    ctx->SetOutput(3, ::xla::Broadcast(zero, {0}));
  }

 private:
  JointXlaAttrs attrs_;
  bool gpu_;
};

class JointLatticeGradXla : public XlaOpKernel {
 public:
  explicit JointLatticeGradXla(::tensorflow::OpKernelConstruction* ctx)
      : XlaOpKernel(ctx), attrs_(ctx), gpu_(on_gpu(ctx)) {}

  void Compile(XlaOpKernelContext* ctx) override {
    std::vector<int64_t> enc, pred, kernel;
    int64_t blank;
    if (!attrs_.dims(ctx, &enc, &pred, &kernel, &blank)) return;
    std::vector<int64_t> lse;
    if (!static_dims(ctx, joint_grad_in::kLse, "lse", 1, &lse)) return;
    const int64_t B = enc[0], T = enc[1], U1 = pred[1];
    if (lse[0] != B * T * U1) {
      ctx->CtxFailure(InvalidArgument("joint_lattice gradient: lse must have ", B * T * U1,
                                      " entries under XLA, got ", lse[0]));
      return;
    }
    std::vector<::xla::XlaOp> operands = joint_operands(ctx);
    operands.push_back(ctx->Input(joint_grad_in::kLse));
    operands.push_back(ctx->Input(joint_grad_in::kDLattice));
    const ::xla::PrimitiveType t = xla_type(ctx->input_type(joint_in::kEncoder));
    emit_custom_call(
        ctx, "tf_rnnt_joint_lattice_grad", operands,
        {::xla::ShapeUtil::MakeShape(t, enc), ::xla::ShapeUtil::MakeShape(t, pred),
         ::xla::ShapeUtil::MakeShape(t, kernel), ::xla::ShapeUtil::MakeShape(t, {kernel[1]}),
         attrs_.workspace(enc, pred, kernel, ctx->input_type(joint_in::kEncoder), blank, true,
                          gpu_)},
        attrs_.dict(blank), {0, 1, 2, 3});
  }

 private:
  JointXlaAttrs attrs_;
  bool gpu_;
};

// The ops with a "dtype" attribute take float, half and bfloat16 inputs.
#define TF_RNNT_XLA_FLOAT_KERNEL(OP, DEVICE, KERNEL)                                            \
  REGISTER_KERNEL_BUILDER(                                                                      \
      Name(OP).Device(DEVICE).TypeConstraint(                                                   \
          "dtype", {::tensorflow::DT_FLOAT, ::tensorflow::DT_HALF, ::tensorflow::DT_BFLOAT16}), \
      KERNEL)

#define TF_RNNT_XLA_KERNELS(DEVICE)                                                      \
  REGISTER_KERNEL_BUILDER(Name("TfRnntLatticeLoss").Device(DEVICE), LatticeLossXla);     \
  TF_RNNT_XLA_FLOAT_KERNEL("TfRnntLogitsToLattice", DEVICE, LogitsToLatticeXla);         \
  TF_RNNT_XLA_FLOAT_KERNEL("TfRnntLogitsToLatticeGrad", DEVICE, LogitsToLatticeGradXla); \
  TF_RNNT_XLA_FLOAT_KERNEL("TfRnntJointLattice", DEVICE, JointLatticeXla);               \
  TF_RNNT_XLA_FLOAT_KERNEL("TfRnntJointLatticeGrad", DEVICE, JointLatticeGradXla);

TF_RNNT_XLA_KERNELS(::tensorflow::DEVICE_CPU_XLA_JIT)
#if TF_RNNT_WITH_CUDA
TF_RNNT_XLA_KERNELS(::tensorflow::DEVICE_GPU_XLA_JIT)
#endif

// ------------------------------------------------------------------ custom-call handlers
ffi::Error invalid(const std::string& message) { return ffi::Error::InvalidArgument(message); }

ffi::Error from_core(const Status& s, const char* op) {
  if (s.ok()) return ffi::Error::Success();
  const std::string message = std::string(op) + ": " + s.message;
  if (s.code == StatusCode::kInvalidArgument) return ffi::Error::InvalidArgument(message);
  if (s.code == StatusCode::kResourceExhausted) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      message + ". Use a smaller tile_size or memory_budget, or a smaller batch.");
  }
  return ffi::Error::Internal(message);
}

bool core_dtype(ffi::DataType t, DType* dtype) {
  switch (t) {
    case ffi::DataType::F32:
      *dtype = DType::kFloat32;
      return true;
    case ffi::DataType::F16:
      *dtype = DType::kFloat16;
      return true;
    case ffi::DataType::BF16:
      *dtype = DType::kBFloat16;
      return true;
    default:
      return false;
  }
}

// The shared checks (kernel_shared.h) as handler errors: "" is success.
ffi::Error invalid_unless_empty(const std::string& message) {
  return message.empty() ? ffi::Error::Success() : invalid(message);
}

// ParallelFor on XLA's intra-op thread pool. The caller takes shards too and never waits for a
// task that has not started, so it cannot deadlock when the pool is busy.
ParallelFor pool_parallel_for(ffi::ThreadPool* pool) {
  return [pool](int64_t total, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) {
    if (total <= 0) return;
    const int64_t threads = std::max<int64_t>(1, pool->num_threads());
    // Shards of at least ~100k cycles; a few per thread for balance.
    const int64_t min_shard = std::max<int64_t>(1, 100000 / std::max<int64_t>(cost, 1));
    const int64_t shard = std::max(min_shard, (total + 4 * threads - 1) / (4 * threads));
    const int64_t shards = (total + shard - 1) / shard;
    if (shards == 1 || threads == 1) {
      fn(0, total);
      return;
    }
    struct State {
      std::atomic<int64_t> next{0};
      std::atomic<int64_t> done{0};
      std::mutex mu;
      std::condition_variable cv;
    };
    auto state = std::make_shared<State>();
    auto work = [state, &fn, total, shard, shards]() {
      for (;;) {
        const int64_t i = state->next.fetch_add(1);
        if (i >= shards) return;
        fn(i * shard, std::min(total, (i + 1) * shard));
        if (state->done.fetch_add(1) + 1 == shards) {
          std::lock_guard<std::mutex> lock(state->mu);
          state->cv.notify_all();
        }
      }
    };
    // Tasks that start after every shard is taken return at once (they hold `state` alive and
    // never touch `fn`).
    for (int64_t i = 1; i < std::min(threads, shards); ++i) {
      pool->Schedule([state, shards, work]() {
        if (state->next.load() < shards) work();
      });
    }
    work();
    std::unique_lock<std::mutex> lock(state->mu);
    state->cv.wait(lock, [&] { return state->done.load() == shards; });
  };
}

// Shape and options of the joint from its buffers and attributes, with the host lengths and
// (when not null) the host labels checked.
ffi::Error joint_config(ffi::AnyBuffer enc, ffi::AnyBuffer pred, ffi::AnyBuffer kernel,
                        int64_t blank, int64_t activation, int64_t allow_tf32,
                        const int32_t* logit_lengths, const int32_t* label_lengths,
                        const int32_t* labels, JointShape* s, JointOptions* o) {
  const auto e = enc.dimensions();
  const auto p = pred.dimensions();
  const auto k = kernel.dimensions();
  s->B = static_cast<int>(e[0]);
  s->T = static_cast<int>(e[1]);
  s->H = static_cast<int>(e[2]);
  s->U1 = static_cast<int>(p[1]);
  s->V = static_cast<int>(k[1]);
  o->blank = static_cast<int>(blank);
  o->activation = static_cast<Activation>(activation);
  o->allow_tf32 = allow_tf32 != 0;
  o->kernel = joint_kernel_from_env();
  if (!core_dtype(enc.element_type(), &o->dtype)) {
    return invalid("joint_lattice: unsupported dtype");
  }
  ffi::Error err =
      invalid_unless_empty(lengths_error(logit_lengths, label_lengths, s->B, s->T, s->U1 - 1));
  if (err.failure()) return err;
  if (!labels) return ffi::Error::Success();
  return invalid_unless_empty(labels_error(labels, label_lengths, s->B, s->U1 - 1, s->V, blank));
}

// The inputs both joint passes read; in.host is left to the caller.
JointInputs joint_inputs(ffi::AnyBuffer enc, ffi::AnyBuffer pred, ffi::AnyBuffer kernel,
                         ffi::AnyBuffer bias, ffi::Buffer<ffi::S32> labels,
                         ffi::Buffer<ffi::S32> logit_lengths, ffi::Buffer<ffi::S32> label_lengths) {
  JointInputs in;
  in.encoder = enc.untyped_data();
  in.predictor = pred.untyped_data();
  in.kernel = kernel.untyped_data();
  in.bias = bias.untyped_data();
  in.labels = labels.typed_data();
  in.logit_lengths = logit_lengths.typed_data();
  in.label_lengths = label_lengths.typed_data();
  return in;
}

// The workspace result, checked to hold the bytes the handler's plan needs.
ffi::Error workspace_for(ffi::Result<ffi::AnyBuffer>& workspace, size_t bytes, void** ptr,
                         const char* op) {
  if (workspace->size_bytes() < bytes) {
    return ffi::Error::Internal(std::string(op) + ": the plan needs " + std::to_string(bytes) +
                                " workspace bytes, the lowering gave " +
                                std::to_string(workspace->size_bytes()));
  }
  *ptr = workspace->untyped_data();
  return ffi::Error::Success();
}

ffi::Error lattice_loss_host(ffi::Buffer<ffi::F32> lattice, ffi::Buffer<ffi::S32> logit_lengths,
                             ffi::Buffer<ffi::S32> label_lengths, ffi::ResultBuffer<ffi::F32> costs,
                             ffi::ResultBuffer<ffi::F32> grads,
                             ffi::Result<ffi::AnyBuffer> workspace, float fastemit_lambda,
                             float clamp, ffi::ThreadPool pool) {
  const auto d = lattice.dimensions();
  const int64_t B = d[0], T = d[1], U1 = d[2];
  ffi::Error err = invalid_unless_empty(
      lengths_error(logit_lengths.typed_data(), label_lengths.typed_data(), B, T, U1 - 1));
  if (err.failure()) return err;
  if (B == 0) return ffi::Error::Success();
  void* alphas;
  err = workspace_for(workspace, 2 * sizeof(float) * B * T * U1, &alphas, "lattice_loss");
  if (err.failure()) return err;
  LatticeLossOptions options;
  options.fastemit_lambda = fastemit_lambda;
  options.clamp = clamp;
  return from_core(
      lattice_loss_cpu(lattice.typed_data(), logit_lengths.typed_data(), label_lengths.typed_data(),
                       B, T, U1, options, costs->typed_data(), grads->typed_data(),
                       static_cast<float*>(alphas), static_cast<float*>(alphas) + B * T * U1,
                       pool_parallel_for(&pool)),
      "lattice_loss");
}

ffi::Error logits_to_lattice_host(ffi::AnyBuffer logits, ffi::Buffer<ffi::S32> labels,
                                  ffi::Buffer<ffi::S32> label_lengths,
                                  ffi::ResultBuffer<ffi::F32> lattice,
                                  ffi::ResultBuffer<ffi::F32> lse, int64_t blank, int64_t validate,
                                  ffi::ThreadPool pool) {
  const auto d = logits.dimensions();
  const int64_t B = d[0], T = d[1], U1 = d[2], V = d[3];
  DType dtype;
  if (!core_dtype(logits.element_type(), &dtype))
    return invalid("logits_to_lattice: unsupported dtype");
  if (validate) {
    ffi::Error err =
        invalid_unless_empty(lengths_error(nullptr, label_lengths.typed_data(), B, T, U1 - 1));
    if (err.failure()) return err;
    err = invalid_unless_empty(
        labels_error(labels.typed_data(), label_lengths.typed_data(), B, U1 - 1, V, blank));
    if (err.failure()) return err;
  }
  return from_core(
      logits_to_lattice_cpu(logits.untyped_data(), dtype, labels.typed_data(), B, T, U1, V, blank,
                            lattice->typed_data(), lse->typed_data(), pool_parallel_for(&pool)),
      "logits_to_lattice");
}

ffi::Error logits_to_lattice_grad_host(ffi::AnyBuffer logits, ffi::Buffer<ffi::S32> labels,
                                       ffi::Buffer<ffi::F32> lse, ffi::Buffer<ffi::F32> d_lattice,
                                       ffi::Result<ffi::AnyBuffer> d_logits, int64_t blank,
                                       ffi::ThreadPool pool) {
  const auto d = logits.dimensions();
  DType dtype;
  if (!core_dtype(logits.element_type(), &dtype))
    return invalid("logits_to_lattice: unsupported dtype");
  return from_core(
      logits_to_lattice_grad_cpu(logits.untyped_data(), dtype, labels.typed_data(), d[0], d[1],
                                 d[2], d[3], blank, lse.typed_data(), d_lattice.typed_data(),
                                 d_logits->untyped_data(), pool_parallel_for(&pool)),
      "logits_to_lattice gradient");
}

// Shape, options, checked lengths (and labels: forward), plan and workspace of the host joint.
struct HostJointPlan {
  JointShape shape;
  JointOptions options;
  std::vector<int64_t> offsets;
  JointInputs in;
  void* workspace = nullptr;

  ffi::Error init(ffi::AnyBuffer enc, ffi::AnyBuffer pred, ffi::AnyBuffer kernel,
                  ffi::AnyBuffer bias, ffi::Buffer<ffi::S32> labels,
                  ffi::Buffer<ffi::S32> logit_lengths, ffi::Buffer<ffi::S32> label_lengths,
                  ffi::Result<ffi::AnyBuffer>& ws, int64_t blank, int64_t activation,
                  int64_t tile_attr, int64_t budget_attr, int64_t allow_tf32, bool backward) {
    // The backward pass needs no label check (the forward pass made it).
    ffi::Error err = joint_config(enc, pred, kernel, blank, activation, allow_tf32,
                                  logit_lengths.typed_data(), label_lengths.typed_data(),
                                  backward ? nullptr : labels.typed_data(), &shape, &options);
    if (err.failure()) return err;
    in = joint_inputs(enc, pred, kernel, bias, labels, logit_lengths, label_lengths);
    in.host = host_plan(in.logit_lengths, in.label_lengths, shape.B, &offsets);
    in.host.tile_nodes =
        tile_nodes_for(shape, options, in.host.num_nodes, tile_attr, budget_attr, false);
    return workspace_for(
        ws, joint_workspace_bytes_cpu(shape, options, in.host.tile_nodes, backward, false),
        &workspace, backward ? "joint_lattice gradient" : "joint_lattice");
  }
};

ffi::Error joint_lattice_host(ffi::AnyBuffer enc, ffi::AnyBuffer pred, ffi::AnyBuffer kernel,
                              ffi::AnyBuffer bias, ffi::Buffer<ffi::S32> labels,
                              ffi::Buffer<ffi::S32> logit_lengths,
                              ffi::Buffer<ffi::S32> label_lengths,
                              ffi::ResultBuffer<ffi::F32> lattice, ffi::ResultBuffer<ffi::F32> lse,
                              ffi::Result<ffi::AnyBuffer> workspace, int64_t blank,
                              int64_t activation, int64_t tile_attr, int64_t budget_attr,
                              int64_t allow_tf32, ffi::ThreadPool pool) {
  HostJointPlan plan;
  ffi::Error err =
      plan.init(enc, pred, kernel, bias, labels, logit_lengths, label_lengths, workspace, blank,
                activation, tile_attr, budget_attr, allow_tf32, false);
  if (err.failure()) return err;
  JointForwardArgs a;
  a.in = plan.in;
  a.workspace = plan.workspace;
  a.lattice = lattice->typed_data();
  a.lse = lse->typed_data();
  return from_core(joint_forward_cpu(plan.shape, plan.options, a, pool_parallel_for(&pool)),
                   "joint_lattice");
}

ffi::Error joint_lattice_grad_host(
    ffi::AnyBuffer enc, ffi::AnyBuffer pred, ffi::AnyBuffer kernel, ffi::AnyBuffer bias,
    ffi::Buffer<ffi::S32> labels, ffi::Buffer<ffi::S32> logit_lengths,
    ffi::Buffer<ffi::S32> label_lengths, ffi::Buffer<ffi::F32> lse, ffi::Buffer<ffi::F32> d_lattice,
    ffi::Result<ffi::AnyBuffer> d_enc, ffi::Result<ffi::AnyBuffer> d_pred,
    ffi::Result<ffi::AnyBuffer> d_kernel, ffi::Result<ffi::AnyBuffer> d_bias,
    ffi::Result<ffi::AnyBuffer> workspace, int64_t blank, int64_t activation, int64_t tile_attr,
    int64_t budget_attr, int64_t allow_tf32, ffi::ThreadPool pool) {
  HostJointPlan plan;
  ffi::Error err =
      plan.init(enc, pred, kernel, bias, labels, logit_lengths, label_lengths, workspace, blank,
                activation, tile_attr, budget_attr, allow_tf32, true);
  if (err.failure()) return err;
  JointBackwardArgs a;
  a.in = plan.in;
  a.workspace = plan.workspace;
  a.lse = lse.typed_data();
  a.d_lattice = d_lattice.typed_data();
  // The launcher writes the gradients in the input dtype.
  a.d_encoder = d_enc->untyped_data();
  a.d_predictor = d_pred->untyped_data();
  a.d_kernel = d_kernel->untyped_data();
  a.d_bias = d_bias->untyped_data();
  return from_core(joint_backward_cpu(plan.shape, plan.options, a, pool_parallel_for(&pool)),
                   "joint_lattice gradient");
}

XLA_FFI_DEFINE_HANDLER(kLatticeLossHost, lattice_loss_host,
                       ffi::Ffi::Bind()
                           .Arg<ffi::Buffer<ffi::F32>>()
                           .Arg<ffi::Buffer<ffi::S32>>()
                           .Arg<ffi::Buffer<ffi::S32>>()
                           .Ret<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<float>("fastemit_lambda")
                           .Attr<float>("clamp")
                           .Ctx<ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER(kLogitsToLatticeHost, logits_to_lattice_host,
                       ffi::Ffi::Bind()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::Buffer<ffi::S32>>()
                           .Arg<ffi::Buffer<ffi::S32>>()
                           .Ret<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::Buffer<ffi::F32>>()
                           .Attr<int64_t>("blank")
                           .Attr<int64_t>("validate")
                           .Ctx<ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER(kLogitsToLatticeGradHost, logits_to_lattice_grad_host,
                       ffi::Ffi::Bind()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::Buffer<ffi::S32>>()
                           .Arg<ffi::Buffer<ffi::F32>>()
                           .Arg<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<int64_t>("blank")
                           .Ctx<ffi::ThreadPool>());

#define TF_RNNT_JOINT_FFI_ATTRS       \
  Attr<int64_t>("blank")              \
      .Attr<int64_t>("activation")    \
      .Attr<int64_t>("tile_nodes")    \
      .Attr<int64_t>("memory_budget") \
      .Attr<int64_t>("allow_tf32")

#define TF_RNNT_JOINT_FFI_INPUTS    \
  Arg<ffi::AnyBuffer>()             \
      .Arg<ffi::AnyBuffer>()        \
      .Arg<ffi::AnyBuffer>()        \
      .Arg<ffi::AnyBuffer>()        \
      .Arg<ffi::Buffer<ffi::S32>>() \
      .Arg<ffi::Buffer<ffi::S32>>() \
      .Arg<ffi::Buffer<ffi::S32>>()

XLA_FFI_DEFINE_HANDLER(kJointLatticeHost, joint_lattice_host,
                       ffi::Ffi::Bind()
                           .TF_RNNT_JOINT_FFI_INPUTS.Ret<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::AnyBuffer>()
                           .TF_RNNT_JOINT_FFI_ATTRS.Ctx<ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER(kJointLatticeGradHost, joint_lattice_grad_host,
                       ffi::Ffi::Bind()
                           .TF_RNNT_JOINT_FFI_INPUTS.Arg<ffi::Buffer<ffi::F32>>()
                           .Arg<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .TF_RNNT_JOINT_FFI_ATTRS.Ctx<ffi::ThreadPool>());

// ---- CUDA
#if TF_RNNT_WITH_CUDA
using CudaStream = cudaStream_t;

ffi::Error cuda_error(cudaError_t e, const char* op) {
  return ffi::Error::Internal(std::string(op) + ": " + cudaGetErrorName(e));
}

struct HostCopy {
  const int32_t* device;
  size_t count;
  std::vector<int32_t>* host;
};

// Copies device int32 buffers to the host and waits for the stream (one synchronization for all).
ffi::Error to_host(std::initializer_list<HostCopy> copies, CudaStream stream, const char* op) {
  for (const HostCopy& c : copies) {
    c.host->resize(c.count);
    if (c.count == 0) continue;
    const cudaError_t e = cudaMemcpyAsync(c.host->data(), c.device, c.count * sizeof(int32_t),
                                          cudaMemcpyDeviceToHost, stream);
    if (e != cudaSuccess) return cuda_error(e, op);
  }
  const cudaError_t e = cudaStreamSynchronize(stream);
  return e == cudaSuccess ? ffi::Error::Success() : cuda_error(e, op);
}

ffi::Error lattice_loss_cuda_ffi(CudaStream stream, ffi::Buffer<ffi::F32> lattice,
                                 ffi::Buffer<ffi::S32> logit_lengths,
                                 ffi::Buffer<ffi::S32> label_lengths,
                                 ffi::ResultBuffer<ffi::F32> costs,
                                 ffi::ResultBuffer<ffi::F32> grads,
                                 ffi::Result<ffi::AnyBuffer> workspace, float fastemit_lambda,
                                 float clamp) {
  const auto d = lattice.dimensions();
  const int64_t B = d[0], T = d[1], U1 = d[2];
  std::vector<int32_t> logit, label;
  ffi::Error err = to_host({{logit_lengths.typed_data(), static_cast<size_t>(B), &logit},
                            {label_lengths.typed_data(), static_cast<size_t>(B), &label}},
                           stream, "lattice_loss");
  if (err.failure()) return err;
  err = invalid_unless_empty(lengths_error(logit.data(), label.data(), B, T, U1 - 1));
  if (err.failure() || B == 0) return err;
  void* alphas;
  err = workspace_for(workspace, 2 * sizeof(float) * B * T * U1, &alphas, "lattice_loss");
  if (err.failure()) return err;
  LatticeLossOptions options;
  options.fastemit_lambda = fastemit_lambda;
  options.clamp = clamp;
  return from_core(
      lattice_loss_cuda(lattice.typed_data(), logit_lengths.typed_data(),
                        label_lengths.typed_data(), B, T, U1, options, costs->typed_data(),
                        grads->typed_data(), static_cast<float*>(alphas),
                        static_cast<float*>(alphas) + B * T * U1, stream),
      "lattice_loss");
}

ffi::Error logits_to_lattice_cuda_ffi(CudaStream stream, ffi::AnyBuffer logits,
                                      ffi::Buffer<ffi::S32> labels,
                                      ffi::Buffer<ffi::S32> label_lengths,
                                      ffi::ResultBuffer<ffi::F32> lattice,
                                      ffi::ResultBuffer<ffi::F32> lse, int64_t blank,
                                      int64_t validate) {
  const auto d = logits.dimensions();
  const int64_t B = d[0], T = d[1], U1 = d[2], V = d[3];
  DType dtype;
  if (!core_dtype(logits.element_type(), &dtype))
    return invalid("logits_to_lattice: unsupported dtype");
  if (validate) {
    std::vector<int32_t> lab, len;
    ffi::Error err = to_host({{label_lengths.typed_data(), static_cast<size_t>(B), &len},
                              {labels.typed_data(), static_cast<size_t>(B * (U1 - 1)), &lab}},
                             stream, "logits_to_lattice");
    if (err.failure()) return err;
    err = invalid_unless_empty(lengths_error(nullptr, len.data(), B, T, U1 - 1));
    if (err.failure()) return err;
    err = invalid_unless_empty(labels_error(lab.data(), len.data(), B, U1 - 1, V, blank));
    if (err.failure()) return err;
  }
  return from_core(
      logits_to_lattice_cuda(logits.untyped_data(), dtype, labels.typed_data(), B, T, U1, V, blank,
                             lattice->typed_data(), lse->typed_data(), stream),
      "logits_to_lattice");
}

ffi::Error logits_to_lattice_grad_cuda_ffi(CudaStream stream, ffi::AnyBuffer logits,
                                           ffi::Buffer<ffi::S32> labels, ffi::Buffer<ffi::F32> lse,
                                           ffi::Buffer<ffi::F32> d_lattice,
                                           ffi::Result<ffi::AnyBuffer> d_logits, int64_t blank) {
  const auto d = logits.dimensions();
  DType dtype;
  if (!core_dtype(logits.element_type(), &dtype))
    return invalid("logits_to_lattice: unsupported dtype");
  return from_core(
      logits_to_lattice_grad_cuda(logits.untyped_data(), dtype, labels.typed_data(), d[0], d[1],
                                  d[2], d[3], blank, lse.typed_data(), d_lattice.typed_data(),
                                  d_logits->untyped_data(), stream),
      "logits_to_lattice gradient");
}

// Host lengths (checked), host plan, tile and workspace for the GPU joint (the launchers compute
// the device node offsets in the workspace).
struct GpuJointPlan {
  JointShape shape;
  JointOptions options;
  std::vector<int32_t> logit, label;
  std::vector<int64_t> offsets;
  JointInputs in;
  void* workspace = nullptr;

  ffi::Error init(CudaStream stream, ffi::AnyBuffer enc, ffi::AnyBuffer pred, ffi::AnyBuffer kernel,
                  ffi::AnyBuffer bias, ffi::Buffer<ffi::S32> labels,
                  ffi::Buffer<ffi::S32> logit_lengths, ffi::Buffer<ffi::S32> label_lengths,
                  ffi::Result<ffi::AnyBuffer>& ws, int64_t blank, int64_t activation,
                  int64_t tile_attr, int64_t budget_attr, int64_t allow_tf32, bool backward) {
    const int64_t B = enc.dimensions()[0], U = pred.dimensions()[1] - 1;
    const char* op = backward ? "joint_lattice gradient" : "joint_lattice";
    // The backward pass needs no labels on the host (the forward pass checked them).
    std::vector<int32_t> host_labels;
    const size_t b = static_cast<size_t>(B);
    ffi::Error err =
        backward ? to_host({{logit_lengths.typed_data(), b, &logit},
                            {label_lengths.typed_data(), b, &label}},
                           stream, op)
                 : to_host({{logit_lengths.typed_data(), b, &logit},
                            {label_lengths.typed_data(), b, &label},
                            {labels.typed_data(), b * static_cast<size_t>(U), &host_labels}},
                           stream, op);
    if (err.failure()) return err;
    err = joint_config(enc, pred, kernel, blank, activation, allow_tf32, logit.data(), label.data(),
                       backward ? nullptr : host_labels.data(), &shape, &options);
    if (err.failure()) return err;
    in = joint_inputs(enc, pred, kernel, bias, labels, logit_lengths, label_lengths);
    in.host = host_plan(logit.data(), label.data(), shape.B, &offsets);
    in.host.tile_nodes =
        tile_nodes_for(shape, options, in.host.num_nodes, tile_attr, budget_attr, true);
    return workspace_for(
        ws, joint_workspace_bytes_cuda(shape, options, in.host.tile_nodes, backward, false),
        &workspace, op);
  }
};

ffi::Error joint_lattice_cuda_ffi(
    CudaStream stream, ffi::AnyBuffer enc, ffi::AnyBuffer pred, ffi::AnyBuffer kernel,
    ffi::AnyBuffer bias, ffi::Buffer<ffi::S32> labels, ffi::Buffer<ffi::S32> logit_lengths,
    ffi::Buffer<ffi::S32> label_lengths, ffi::ResultBuffer<ffi::F32> lattice,
    ffi::ResultBuffer<ffi::F32> lse, ffi::Result<ffi::AnyBuffer> workspace, int64_t blank,
    int64_t activation, int64_t tile_attr, int64_t budget_attr, int64_t allow_tf32) {
  GpuJointPlan plan;
  ffi::Error err =
      plan.init(stream, enc, pred, kernel, bias, labels, logit_lengths, label_lengths, workspace,
                blank, activation, tile_attr, budget_attr, allow_tf32, false);
  if (err.failure()) return err;
  JointForwardArgs a;
  a.in = plan.in;
  a.workspace = plan.workspace;
  a.lattice = lattice->typed_data();
  a.lse = lse->typed_data();
  return from_core(joint_forward_cuda(plan.shape, plan.options, a, stream), "joint_lattice");
}

ffi::Error joint_lattice_grad_cuda_ffi(
    CudaStream stream, ffi::AnyBuffer enc, ffi::AnyBuffer pred, ffi::AnyBuffer kernel,
    ffi::AnyBuffer bias, ffi::Buffer<ffi::S32> labels, ffi::Buffer<ffi::S32> logit_lengths,
    ffi::Buffer<ffi::S32> label_lengths, ffi::Buffer<ffi::F32> lse, ffi::Buffer<ffi::F32> d_lattice,
    ffi::Result<ffi::AnyBuffer> d_enc, ffi::Result<ffi::AnyBuffer> d_pred,
    ffi::Result<ffi::AnyBuffer> d_kernel, ffi::Result<ffi::AnyBuffer> d_bias,
    ffi::Result<ffi::AnyBuffer> workspace, int64_t blank, int64_t activation, int64_t tile_attr,
    int64_t budget_attr, int64_t allow_tf32) {
  GpuJointPlan plan;
  ffi::Error err =
      plan.init(stream, enc, pred, kernel, bias, labels, logit_lengths, label_lengths, workspace,
                blank, activation, tile_attr, budget_attr, allow_tf32, true);
  if (err.failure()) return err;
  JointBackwardArgs a;
  a.in = plan.in;
  a.workspace = plan.workspace;
  a.lse = lse.typed_data();
  a.d_lattice = d_lattice.typed_data();
  // The launcher writes the gradients in the input dtype.
  a.d_encoder = d_enc->untyped_data();
  a.d_predictor = d_pred->untyped_data();
  a.d_kernel = d_kernel->untyped_data();
  a.d_bias = d_bias->untyped_data();
  return from_core(joint_backward_cuda(plan.shape, plan.options, a, stream),
                   "joint_lattice gradient");
}

#define TF_RNNT_CUDA_CTX Ctx<ffi::PlatformStream<CudaStream>>()

XLA_FFI_DEFINE_HANDLER(kLatticeLossCuda, lattice_loss_cuda_ffi,
                       ffi::Ffi::Bind()
                           .TF_RNNT_CUDA_CTX.Arg<ffi::Buffer<ffi::F32>>()
                           .Arg<ffi::Buffer<ffi::S32>>()
                           .Arg<ffi::Buffer<ffi::S32>>()
                           .Ret<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<float>("fastemit_lambda")
                           .Attr<float>("clamp"));

XLA_FFI_DEFINE_HANDLER(kLogitsToLatticeCuda, logits_to_lattice_cuda_ffi,
                       ffi::Ffi::Bind()
                           .TF_RNNT_CUDA_CTX.Arg<ffi::AnyBuffer>()
                           .Arg<ffi::Buffer<ffi::S32>>()
                           .Arg<ffi::Buffer<ffi::S32>>()
                           .Ret<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::Buffer<ffi::F32>>()
                           .Attr<int64_t>("blank")
                           .Attr<int64_t>("validate"));

XLA_FFI_DEFINE_HANDLER(kLogitsToLatticeGradCuda, logits_to_lattice_grad_cuda_ffi,
                       ffi::Ffi::Bind()
                           .TF_RNNT_CUDA_CTX.Arg<ffi::AnyBuffer>()
                           .Arg<ffi::Buffer<ffi::S32>>()
                           .Arg<ffi::Buffer<ffi::F32>>()
                           .Arg<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<int64_t>("blank"));

XLA_FFI_DEFINE_HANDLER(kJointLatticeCuda, joint_lattice_cuda_ffi,
                       ffi::Ffi::Bind()
                           .TF_RNNT_CUDA_CTX.TF_RNNT_JOINT_FFI_INPUTS.Ret<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::AnyBuffer>()
                           .TF_RNNT_JOINT_FFI_ATTRS);

XLA_FFI_DEFINE_HANDLER(kJointLatticeGradCuda, joint_lattice_grad_cuda_ffi,
                       ffi::Ffi::Bind()
                           .TF_RNNT_CUDA_CTX.TF_RNNT_JOINT_FFI_INPUTS.Arg<ffi::Buffer<ffi::F32>>()
                           .Arg<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .TF_RNNT_JOINT_FFI_ATTRS);
#endif  // TF_RNNT_WITH_CUDA

// ------------------------------------------------------------------ registration
void register_handler(const XLA_FFI_Api* api, const char* name, const char* platform,
                      XLA_FFI_Handler* handler) {
  XLA_FFI_Handler_Register_Args args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_Handler_Register_Args_STRUCT_SIZE;
  args.name = XLA_FFI_ByteSpan{name, std::strlen(name)};
  args.platform = XLA_FFI_ByteSpan{platform, std::strlen(platform)};
  args.bundle.execute = handler;
  if (XLA_FFI_Error* error = api->XLA_FFI_Handler_Register(&args)) {
    XLA_FFI_Error_GetMessage_Args message;
    std::memset(&message, 0, sizeof(message));
    message.struct_size = XLA_FFI_Error_GetMessage_Args_STRUCT_SIZE;
    message.error = error;
    api->XLA_FFI_Error_GetMessage(&message);
    std::fprintf(stderr, "tf_rnnt: could not register XLA custom call %s for %s: %s\n", name,
                 platform, message.message);
    XLA_FFI_Error_Destroy_Args destroy;
    std::memset(&destroy, 0, sizeof(destroy));
    destroy.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
    destroy.error = error;
    api->XLA_FFI_Error_Destroy(&destroy);
  }
}

const bool kHandlersRegistered = [] {
  const XLA_FFI_Api* api = XLA_FFI_GetApi();
  register_handler(api, "tf_rnnt_lattice_loss", "Host", kLatticeLossHost);
  register_handler(api, "tf_rnnt_logits_to_lattice", "Host", kLogitsToLatticeHost);
  register_handler(api, "tf_rnnt_logits_to_lattice_grad", "Host", kLogitsToLatticeGradHost);
  register_handler(api, "tf_rnnt_joint_lattice", "Host", kJointLatticeHost);
  register_handler(api, "tf_rnnt_joint_lattice_grad", "Host", kJointLatticeGradHost);
#if TF_RNNT_WITH_CUDA
  register_handler(api, "tf_rnnt_lattice_loss", "CUDA", kLatticeLossCuda);
  register_handler(api, "tf_rnnt_logits_to_lattice", "CUDA", kLogitsToLatticeCuda);
  register_handler(api, "tf_rnnt_logits_to_lattice_grad", "CUDA", kLogitsToLatticeGradCuda);
  register_handler(api, "tf_rnnt_joint_lattice", "CUDA", kJointLatticeCuda);
  register_handler(api, "tf_rnnt_joint_lattice_grad", "CUDA", kJointLatticeGradCuda);
#endif
  return true;
}();

}  // namespace
}  // namespace tf_rnnt
