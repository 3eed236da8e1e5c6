// XLA lowering of the ops: each op (and gradient op) becomes an XLA custom call ("typed FFI" API)
// on the handlers of xla_handlers.cc, which call the same core launchers as the TensorFlow
// kernels. The kernels are registered for the XLA_CPU_JIT / XLA_GPU_JIT devices directly in
// TensorFlow's kernel registry (not through XlaOpRegistry, whose kernels are only registered once
// per process and would miss a library loaded after the first compilation).
//
// Under XLA every buffer has a static shape: the lowering makes the graph kernels' shape checks
// (kernel_shared.h) on it, with their messages. The joint's packed log-sum-exp gets B * T * U1
// entries (the first num_nodes are used), and it always runs tiled (mode="untiled" keeps
// nothing). Workspaces are an extra u8 result of each custom call, so XLA allocates them with its
// other buffers (its GPU scratch allocator refuses even small requests); the joint's is planned
// (plan_joint_pass) with all B * T * U1 nodes valid, an upper bound of the handler's plan.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "kernel_shared.h"
#include "op_inputs.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/core/framework/kernel_def_builder.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/types.h"
#include "tf_rnnt/rnnt_core.h"
#include "xla/hlo/builder/xla_builder.h"
#include "xla/shape_util.h"

namespace tf_rnnt {
namespace {

using ::tensorflow::XlaOpKernel;
using ::tensorflow::XlaOpKernelContext;
using ::tensorflow::errors::InvalidArgument;

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

// The static dimensions of input `index` (a failure, false, when they are not static).
bool xla_dims(XlaOpKernelContext* ctx, int index, const char* name, Dims* dims) {
  auto shape = ctx->InputXlaShape(index);
  if (!shape.ok()) {
    ctx->CtxFailure(shape.status());
    return false;
  }
  if (!shape->is_static()) {
    ctx->CtxFailure(
        InvalidArgument(name, " must have a static shape under XLA, got ", shape->ToString()));
    return false;
  }
  dims->assign(shape->dimensions().begin(), shape->dimensions().end());
  return true;
}

// A shape check's result (kernel_shared.h) as the op's failure; false when it is not empty.
bool shapes_ok(XlaOpKernelContext* ctx, const std::string& error) {
  if (error.empty()) return true;
  ctx->CtxFailure(InvalidArgument(error));
  return false;
}

::xla::Shape f32_shape(const Dims& dims) { return ::xla::ShapeUtil::MakeShape(::xla::F32, dims); }

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
    OP_REQUIRES_OK(ctx, ctx->GetAttr("validate_lengths", &validate_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    using namespace lattice_loss_in;  // NOLINT: the input names
    Dims d, logit, label;
    if (!xla_dims(ctx, kLattice, "lattice", &d) ||
        !xla_dims(ctx, kLogitLengths, "logit_lengths", &logit) ||
        !xla_dims(ctx, kLabelLengths, "label_lengths", &label) ||
        !shapes_ok(ctx, lattice_loss_shapes_error(d, logit, label, validate_))) {
      return;
    }
    // Workspace: alphas and betas, [B, T, U1] each.
    emit_custom_call(
        ctx, "tf_rnnt_lattice_loss",
        {ctx->Input(kLattice), ctx->Input(kLogitLengths), ctx->Input(kLabelLengths)},
        {f32_shape({d[0]}), f32_shape(d), workspace_shape(2 * sizeof(float) * d[0] * d[1] * d[2])},
        AttrDict().f32("fastemit_lambda", fastemit_lambda_).f32("clamp", clamp_), {0, 1});
  }

 private:
  float fastemit_lambda_ = 0.f, clamp_ = -1.f;
  bool validate_ = true;
};

class LogitsToLatticeXla : public XlaOpKernel {
 public:
  explicit LogitsToLatticeXla(::tensorflow::OpKernelConstruction* ctx) : XlaOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("blank", &blank_attr_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("validate_labels", &validate_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    using namespace logits_to_lattice_in;  // NOLINT: the input names
    Dims d, labels, lengths;
    if (!xla_dims(ctx, kLogits, "logits", &d) || !xla_dims(ctx, kLabels, "labels", &labels) ||
        !xla_dims(ctx, kLabelLengthsHost, "label_lengths", &lengths) ||
        !shapes_ok(ctx,
                   logits_to_lattice_shapes_error(d, labels, validate_ ? &lengths : nullptr))) {
      return;
    }
    int64_t blank;
    if (!normalize_blank(ctx, blank_attr_, d[3], &blank)) return;
    // Validation reads the labels and the label lengths; without it, an empty vector.
    emit_custom_call(ctx, "tf_rnnt_logits_to_lattice",
                     {ctx->Input(kLogits), ctx->Input(kLabels), ctx->Input(kLabelLengthsHost)},
                     {f32_shape({d[0], d[1], d[2], 2}), f32_shape({d[0], d[1], d[2]})},
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
    Dims d;
    if (!xla_dims(ctx, kLogits, "logits", &d)) return;
    if (d.size() != 4) {
      ctx->CtxFailure(
          InvalidArgument("logits must have shape [B, T, U+1, V], got ", shape_string(d)));
      return;
    }
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

// The joint ops' lowering: shapes checked as the graph kernels check them, the attributes as
// the handlers' backend config (untiled is ignored: under XLA the joint always runs tiled), the
// workspace of the largest plan.
class JointXla : public XlaOpKernel {
 public:
  JointXla(::tensorflow::OpKernelConstruction* ctx, bool backward)
      : XlaOpKernel(ctx),
        attrs_(ctx),
        backward_(backward),
        gpu_(ctx->device_type() == ::tensorflow::DeviceType(::tensorflow::DEVICE_GPU_XLA_JIT)) {}

 protected:
  // Checks the inputs' shapes and emits the custom call with `results` (the workspace added) and
  // `extra` operands after the shared ones; outputs[i] is result i. Returns the dimensions of
  // encoder, predictor and kernel (empty on failure).
  bool emit(XlaOpKernelContext* ctx, const char* target, std::vector<::xla::Shape> results,
            const std::vector<int>& extra, const std::vector<int>& outputs) {
    using namespace joint_in;  // NOLINT: the input names
    static const char* const kNames[] = {"encoder", "predictor",     "kernel",       "bias",
                                         "labels",  "logit_lengths", "label_lengths"};
    Dims d[7];
    for (int i = kEncoder; i <= kLabelLengths; ++i) {
      if (!xla_dims(ctx, i, kNames[i], &d[i])) return false;
    }
    if (!shapes_ok(ctx, joint_shapes_error(d[0], d[1], d[2], d[3], d[4], d[5], d[6],
                                           attrs_.num_durations))) {
      return false;
    }
    JointShape s;
    s.B = static_cast<int>(d[kEncoder][0]);
    s.T = static_cast<int>(d[kEncoder][1]);
    s.H = static_cast<int>(d[kEncoder][2]);
    s.U1 = static_cast<int>(d[kPredictor][1]);
    s.V = static_cast<int>(d[kKernel][1]);
    s.D = attrs_.num_durations;
    int64_t blank;
    if (!normalize_blank(ctx, attrs_.blank_attr, token_columns(s), &blank)) return false;
    JointOptions o;
    o.blank = static_cast<int>(blank);
    o.activation = attrs_.activation;
    o.dtype = core_dtype(ctx->input_type(kEncoder));
    o.allow_tf32 = attrs_.allow_tf32;
    o.kernel = attrs_.kernel;
    JointPassPlan plan;
    const Status planned = plan_joint_pass(s, o, static_cast<int64_t>(s.B) * s.T * s.U1,
                                           attrs_.tile_request(false), backward_, gpu_, &plan);
    if (!planned.ok()) {
      ctx->CtxFailure(InvalidArgument("joint_lattice: ", planned.message));
      return false;
    }
    results.push_back(workspace_shape(plan.workspace_bytes));
    std::vector<::xla::XlaOp> operands;
    for (int i = kEncoder; i <= kLabelLengths; ++i) operands.push_back(ctx->Input(i));
    for (int i : extra) operands.push_back(ctx->Input(i));
    emit_custom_call(ctx, target, operands, results,
                     AttrDict()
                         .i64("blank", blank)
                         .i64("activation", static_cast<int64_t>(o.activation))
                         .i64("tile_nodes", attrs_.tile_nodes)
                         .i64("memory_budget", attrs_.memory_budget)
                         .i64("allow_tf32", o.allow_tf32 ? 1 : 0)
                         .i64("gpu_kernel", static_cast<int64_t>(o.kernel))
                         .i64("num_durations", s.D),
                     outputs);
    return true;
  }

  static DType core_dtype(::tensorflow::DataType dt) {
    return dt == ::tensorflow::DT_HALF       ? DType::kFloat16
           : dt == ::tensorflow::DT_BFLOAT16 ? DType::kBFloat16
                                             : DType::kFloat32;
  }

  JointAttrs attrs_;
  bool backward_, gpu_;
};

class JointLatticeXla : public JointXla {
 public:
  explicit JointLatticeXla(::tensorflow::OpKernelConstruction* ctx) : JointXla(ctx, false) {}

  void Compile(XlaOpKernelContext* ctx) override {
    auto dims = ctx->InputXlaShape(joint_in::kEncoder);
    auto pred = ctx->InputXlaShape(joint_in::kPredictor);
    if (!dims.ok() || !pred.ok() || dims->dimensions().size() != 3 ||
        pred->dimensions().size() != 3) {
      // joint_shapes_error reports it.
      emit(ctx, "tf_rnnt_joint_lattice", {}, {}, {0, 1});
      return;
    }
    const int64_t B = dims->dimensions()[0], T = dims->dimensions()[1], U1 = pred->dimensions()[1];
    const int64_t C = 2 + attrs_.num_durations;
    if (!emit(ctx, "tf_rnnt_joint_lattice", {f32_shape({B, T, U1, C}), f32_shape({B * T * U1})}, {},
              {0, 1})) {
      return;
    }
    // Nothing is kept for the backward pass beyond the log-sum-exp: empty saved buffers.
    const ::xla::XlaOp zero = ::xla::ConstantR0<float>(ctx->builder(), 0.f);
    ctx->SetOutput(2, ::xla::Broadcast(::xla::ConvertElementType(
                                           zero, xla_type(ctx->input_type(joint_in::kEncoder))),
                                       {0}));
    ctx->SetOutput(3, ::xla::Broadcast(zero, {0}));
  }
};

class JointLatticeGradXla : public JointXla {
 public:
  explicit JointLatticeGradXla(::tensorflow::OpKernelConstruction* ctx) : JointXla(ctx, true) {}

  void Compile(XlaOpKernelContext* ctx) override {
    using namespace joint_in;  // NOLINT: the input names
    Dims d[4], lse;
    static const char* const kNames[] = {"encoder", "predictor", "kernel", "bias"};
    for (int i = kEncoder; i <= kBias; ++i) {
      if (!xla_dims(ctx, i, kNames[i], &d[i])) return;
    }
    if (!xla_dims(ctx, joint_grad_in::kLse, "lse", &lse)) return;
    const int64_t nodes = d[0].size() == 3 && d[1].size() == 3 ? d[0][0] * d[0][1] * d[1][1] : -1;
    if (nodes >= 0 && (lse.size() != 1 || lse[0] != nodes)) {
      ctx->CtxFailure(InvalidArgument("joint_lattice gradient: lse must have ", nodes,
                                      " entries under XLA, got ", shape_string(lse)));
      return;
    }
    const ::xla::PrimitiveType t = xla_type(ctx->input_type(kEncoder));
    std::vector<::xla::Shape> results;
    for (int i = kEncoder; i <= kBias; ++i) results.push_back(::xla::ShapeUtil::MakeShape(t, d[i]));
    emit(ctx, "tf_rnnt_joint_lattice_grad", results,
         {joint_grad_in::kLse, joint_grad_in::kDLattice}, {0, 1, 2, 3});
  }
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

}  // namespace
}  // namespace tf_rnnt
