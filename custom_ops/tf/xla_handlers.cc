// XLA FFI handlers of the ops' custom calls (lowered in xla_lowering.cc), for the Host and CUDA
// platforms: one template per op over the platform, which says where the launchers run and how
// int32 buffers reach the host. Each handler repeats the graph kernels' shape checks on its
// buffers (kernel_shared.h) and validates lengths and labels on the host; on the GPU they are
// copied to the host on the op's stream, which synchronizes it (the joint also needs the host
// lengths to plan its tiles, plan_joint_pass, as the lowering planned its workspace).
#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kernel_shared.h"
#include "tf_rnnt/rnnt_core.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"
#include "xla_shared.h"

// The joint's attributes (the lowering's backend config).
struct TfRnntJointFfiAttrs {
  int64_t activation, allow_tf32, blank, gpu_kernel, memory_budget, num_durations, tile_nodes;
};
XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(TfRnntJointFfiAttrs,
                                      ::xla::ffi::StructMember<int64_t>("activation"),
                                      ::xla::ffi::StructMember<int64_t>("allow_tf32"),
                                      ::xla::ffi::StructMember<int64_t>("blank"),
                                      ::xla::ffi::StructMember<int64_t>("gpu_kernel"),
                                      ::xla::ffi::StructMember<int64_t>("memory_budget"),
                                      ::xla::ffi::StructMember<int64_t>("num_durations"),
                                      ::xla::ffi::StructMember<int64_t>("tile_nodes"));

namespace tf_rnnt {
namespace {

namespace ffi = ::xla::ffi;
using I32 = ffi::Buffer<ffi::S32>;
using F32 = ffi::Buffer<ffi::F32>;
using Workspace = ffi::Result<ffi::AnyBuffer>;

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

// The dimensions of a buffer, for the shape checks.
template <typename Buffer>
Dims dims_of(const Buffer& b) {
  const auto d = b.dimensions();
  return Dims(d.begin(), d.end());
}

// The workspace result, checked to hold the bytes the handler's plan needs.
ffi::Error workspace_for(Workspace& workspace, size_t bytes, void** ptr, const char* op) {
  if (workspace->size_bytes() < bytes) {
    return ffi::Error::Internal(std::string(op) + ": the plan needs " + std::to_string(bytes) +
                                " workspace bytes, the lowering gave " +
                                std::to_string(workspace->size_bytes()));
  }
  *ptr = workspace->untyped_data();
  return ffi::Error::Success();
}

// An int32 buffer wanted on the host: `count` values at `device`; *host points at them there.
struct HostInts {
  const int32_t* device;
  size_t count;
  const int32_t** host;
};

// ------------------------------------------------------------------ platforms
// Each gives: Ctx, the handler's context argument, bound as CtxBinding; kGpu; read_ints, which
// brings int32 buffers to the host (storage keeps copies alive); and the core's launchers
// name(args..., ctx).
#define TF_RNNT_FFI_LAUNCHERS(suffix, runner)                      \
  template <typename... A>                                         \
  static Status lattice_loss(A&&... a) {                           \
    return lattice_loss_##suffix(std::forward<A>(a)...);           \
  }                                                                \
  template <typename... A>                                         \
  static Status logits_to_lattice(A&&... a) {                      \
    return logits_to_lattice_##suffix(std::forward<A>(a)...);      \
  }                                                                \
  template <typename... A>                                         \
  static Status logits_to_lattice_grad(A&&... a) {                 \
    return logits_to_lattice_grad_##suffix(std::forward<A>(a)...); \
  }                                                                \
  template <typename... A>                                         \
  static Status joint_forward(A&&... a) {                          \
    return joint_forward_##suffix(std::forward<A>(a)...);          \
  }                                                                \
  template <typename... A>                                         \
  static Status joint_backward(A&&... a) {                         \
    return joint_backward_##suffix(std::forward<A>(a)...);         \
  }                                                                \
  static auto run_on(Ctx& ctx) { return runner; }

// Host buffers; the launchers run on XLA's intra-op thread pool.
struct HostPlatform {
  using Ctx = ffi::ThreadPool;
  using CtxBinding = ffi::ThreadPool;
  static constexpr bool kGpu = false;
  static ffi::Error read_ints(Ctx&, std::initializer_list<HostInts> ints,
                              std::vector<int32_t>* /*storage*/, const char* /*op*/) {
    for (const HostInts& i : ints) *i.host = i.device;
    return ffi::Error::Success();
  }
  TF_RNNT_FFI_LAUNCHERS(cpu, pool_parallel_for(&ctx))
};

#if TF_RNNT_WITH_CUDA
// Device buffers; the launchers run on the op's stream.
struct CudaPlatform {
  using Ctx = cudaStream_t;
  using CtxBinding = ffi::PlatformStream<cudaStream_t>;
  static constexpr bool kGpu = true;
  static ffi::Error cuda_error(cudaError_t e, const char* op) {
    return ffi::Error::Internal(std::string(op) + ": " + cudaGetErrorName(e));
  }
  // Copies to the host, then waits for the stream (one synchronization for all).
  static ffi::Error read_ints(Ctx& stream, std::initializer_list<HostInts> ints,
                              std::vector<int32_t>* storage, const char* op) {
    size_t total = 0;
    for (const HostInts& i : ints) total += i.count;
    storage->resize(total);
    size_t at = 0;
    for (const HostInts& i : ints) {
      *i.host = storage->data() + at;
      if (i.count > 0) {
        const cudaError_t e =
            cudaMemcpyAsync(storage->data() + at, i.device, i.count * sizeof(int32_t),
                            cudaMemcpyDeviceToHost, stream);
        if (e != cudaSuccess) return cuda_error(e, op);
      }
      at += i.count;
    }
    const cudaError_t e = cudaStreamSynchronize(stream);
    return e == cudaSuccess ? ffi::Error::Success() : cuda_error(e, op);
  }
  TF_RNNT_FFI_LAUNCHERS(cuda, static_cast<GpuStream>(ctx))
};
#endif

// ------------------------------------------------------------------ handlers
template <typename P>
ffi::Error lattice_loss_ffi(F32 lattice, I32 logit_lengths, I32 label_lengths,
                            ffi::ResultBuffer<ffi::F32> costs, ffi::ResultBuffer<ffi::F32> grads,
                            Workspace workspace, float fastemit_lambda, float clamp,
                            typename P::Ctx ctx) {
  ffi::Error err = invalid_unless_empty(lattice_loss_shapes_error(
      dims_of(lattice), dims_of(logit_lengths), dims_of(label_lengths), true));
  if (err.failure()) return err;
  const auto d = lattice.dimensions();
  const int64_t B = d[0], T = d[1], U1 = d[2];
  std::vector<int32_t> storage;
  const int32_t *logit = nullptr, *label = nullptr;
  err = P::read_ints(ctx,
                     {{logit_lengths.typed_data(), static_cast<size_t>(B), &logit},
                      {label_lengths.typed_data(), static_cast<size_t>(B), &label}},
                     &storage, "lattice_loss");
  if (err.failure()) return err;
  err = invalid_unless_empty(lengths_error(logit, label, B, T, U1 - 1));
  if (err.failure() || B == 0) return err;
  void* alphas;
  err = workspace_for(workspace, 2 * sizeof(float) * B * T * U1, &alphas, "lattice_loss");
  if (err.failure()) return err;
  LatticeLossOptions options;
  options.fastemit_lambda = fastemit_lambda;
  options.clamp = clamp;
  return from_core(
      P::lattice_loss(lattice.typed_data(), logit_lengths.typed_data(), label_lengths.typed_data(),
                      B, T, U1, options, costs->typed_data(), grads->typed_data(),
                      static_cast<float*>(alphas), static_cast<float*>(alphas) + B * T * U1,
                      P::run_on(ctx)),
      "lattice_loss");
}

template <typename P>
ffi::Error logits_to_lattice_ffi(ffi::AnyBuffer logits, I32 labels, I32 label_lengths,
                                 ffi::ResultBuffer<ffi::F32> lattice,
                                 ffi::ResultBuffer<ffi::F32> lse, int64_t blank, int64_t validate,
                                 typename P::Ctx ctx) {
  const Dims lengths_dims = dims_of(label_lengths);
  ffi::Error err = invalid_unless_empty(logits_to_lattice_shapes_error(
      dims_of(logits), dims_of(labels), validate ? &lengths_dims : nullptr));
  if (err.failure()) return err;
  const auto d = logits.dimensions();
  const int64_t B = d[0], T = d[1], U1 = d[2], V = d[3];
  DType dtype;
  if (!core_dtype(logits.element_type(), &dtype)) {
    return invalid("logits_to_lattice: unsupported dtype");
  }
  if (validate) {
    std::vector<int32_t> storage;
    const int32_t *len = nullptr, *lab = nullptr;
    err = P::read_ints(ctx,
                       {{label_lengths.typed_data(), static_cast<size_t>(B), &len},
                        {labels.typed_data(), static_cast<size_t>(B * (U1 - 1)), &lab}},
                       &storage, "logits_to_lattice");
    if (err.failure()) return err;
    err = invalid_unless_empty(lengths_error(nullptr, len, B, T, U1 - 1));
    if (err.failure()) return err;
    err = invalid_unless_empty(labels_error(lab, len, B, U1 - 1, V, blank));
    if (err.failure()) return err;
  }
  return from_core(
      P::logits_to_lattice(logits.untyped_data(), dtype, labels.typed_data(), B, T, U1, V, blank,
                           lattice->typed_data(), lse->typed_data(), P::run_on(ctx)),
      "logits_to_lattice");
}

template <typename P>
ffi::Error logits_to_lattice_grad_ffi(ffi::AnyBuffer logits, I32 labels, F32 lse, F32 d_lattice,
                                      ffi::Result<ffi::AnyBuffer> d_logits, int64_t blank,
                                      typename P::Ctx ctx) {
  const auto d = logits.dimensions();
  DType dtype;
  if (!core_dtype(logits.element_type(), &dtype)) {
    return invalid("logits_to_lattice: unsupported dtype");
  }
  return from_core(
      P::logits_to_lattice_grad(logits.untyped_data(), dtype, labels.typed_data(), d[0], d[1], d[2],
                                d[3], blank, lse.typed_data(), d_lattice.typed_data(),
                                d_logits->untyped_data(), P::run_on(ctx)),
      "logits_to_lattice gradient");
}

// The joint's buffers both passes read.
struct JointBuffersIn {
  ffi::AnyBuffer enc, pred, kernel, bias;
  I32 labels, logit_lengths, label_lengths;
};

// Shapes checked, host lengths (and labels: forward) checked, options, the host plan, the tile
// and the workspace of a joint pass.
template <typename P>
struct JointFfiPlan {
  JointShape shape;
  JointOptions options;
  std::vector<int32_t> storage;
  std::vector<int64_t> offsets;
  JointInputs in;
  void* workspace = nullptr;

  ffi::Error init(typename P::Ctx& ctx, const JointBuffersIn& b, Workspace& ws,
                  const TfRnntJointFfiAttrs& attrs, bool backward) {
    const char* op = backward ? "joint_lattice gradient" : "joint_lattice";
    ffi::Error err = invalid_unless_empty(joint_shapes_error(
        dims_of(b.enc), dims_of(b.pred), dims_of(b.kernel), dims_of(b.bias), dims_of(b.labels),
        dims_of(b.logit_lengths), dims_of(b.label_lengths), attrs.num_durations));
    if (err.failure()) return err;
    const auto e = b.enc.dimensions();
    shape.B = static_cast<int>(e[0]);
    shape.T = static_cast<int>(e[1]);
    shape.H = static_cast<int>(e[2]);
    shape.U1 = static_cast<int>(b.pred.dimensions()[1]);
    shape.V = static_cast<int>(b.kernel.dimensions()[1]);
    shape.D = static_cast<int>(attrs.num_durations);
    options.blank = static_cast<int>(attrs.blank);
    options.activation = static_cast<Activation>(attrs.activation);
    options.allow_tf32 = attrs.allow_tf32 != 0;
    options.kernel = static_cast<JointKernel>(attrs.gpu_kernel);
    if (!core_dtype(b.enc.element_type(), &options.dtype)) {
      return invalid("joint_lattice: unsupported dtype");
    }
    // The backward pass needs no labels on the host (the forward pass checked them).
    const size_t B = static_cast<size_t>(shape.B), U = static_cast<size_t>(shape.U1 - 1);
    const int32_t *logit = nullptr, *label = nullptr, *labels = nullptr;
    err = backward ? P::read_ints(ctx,
                                  {{b.logit_lengths.typed_data(), B, &logit},
                                   {b.label_lengths.typed_data(), B, &label}},
                                  &storage, op)
                   : P::read_ints(ctx,
                                  {{b.logit_lengths.typed_data(), B, &logit},
                                   {b.label_lengths.typed_data(), B, &label},
                                   {b.labels.typed_data(), B * U, &labels}},
                                  &storage, op);
    if (err.failure()) return err;
    err = invalid_unless_empty(lengths_error(logit, label, shape.B, shape.T, shape.U1 - 1));
    if (err.failure()) return err;
    if (labels) {
      err = invalid_unless_empty(
          labels_error(labels, label, shape.B, shape.U1 - 1, token_columns(shape), attrs.blank));
      if (err.failure()) return err;
    }
    in.encoder = b.enc.untyped_data();
    in.predictor = b.pred.untyped_data();
    in.kernel = b.kernel.untyped_data();
    in.bias = b.bias.untyped_data();
    in.labels = b.labels.typed_data();
    in.logit_lengths = b.logit_lengths.typed_data();
    in.label_lengths = b.label_lengths.typed_data();
    in.host = host_plan(logit, label, shape.B, &offsets);
    JointTileRequest request;
    request.tile_nodes = attrs.tile_nodes;
    request.memory_budget = attrs.memory_budget;
    JointPassPlan plan;
    err = from_core(
        plan_joint_pass(shape, options, in.host.num_nodes, request, backward, P::kGpu, &plan), op);
    if (err.failure()) return err;
    in.host.tile_nodes = plan.tile_nodes;
    return workspace_for(ws, plan.workspace_bytes, &workspace, op);
  }
};

template <typename P>
ffi::Error joint_lattice_ffi(ffi::AnyBuffer enc, ffi::AnyBuffer pred, ffi::AnyBuffer kernel,
                             ffi::AnyBuffer bias, I32 labels, I32 logit_lengths, I32 label_lengths,
                             ffi::ResultBuffer<ffi::F32> lattice, ffi::ResultBuffer<ffi::F32> lse,
                             Workspace workspace, TfRnntJointFfiAttrs attrs, typename P::Ctx ctx) {
  JointFfiPlan<P> plan;
  ffi::Error err = plan.init(ctx, {enc, pred, kernel, bias, labels, logit_lengths, label_lengths},
                             workspace, attrs, false);
  if (err.failure()) return err;
  JointForwardArgs a;
  a.in = plan.in;
  a.workspace = plan.workspace;
  a.lattice = lattice->typed_data();
  a.lse = lse->typed_data();
  return from_core(P::joint_forward(plan.shape, plan.options, a, P::run_on(ctx)), "joint_lattice");
}

template <typename P>
ffi::Error joint_lattice_grad_ffi(ffi::AnyBuffer enc, ffi::AnyBuffer pred, ffi::AnyBuffer kernel,
                                  ffi::AnyBuffer bias, I32 labels, I32 logit_lengths,
                                  I32 label_lengths, F32 lse, F32 d_lattice,
                                  ffi::Result<ffi::AnyBuffer> d_enc,
                                  ffi::Result<ffi::AnyBuffer> d_pred,
                                  ffi::Result<ffi::AnyBuffer> d_kernel,
                                  ffi::Result<ffi::AnyBuffer> d_bias, Workspace workspace,
                                  TfRnntJointFfiAttrs attrs, typename P::Ctx ctx) {
  JointFfiPlan<P> plan;
  ffi::Error err = plan.init(ctx, {enc, pred, kernel, bias, labels, logit_lengths, label_lengths},
                             workspace, attrs, true);
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
  return from_core(P::joint_backward(plan.shape, plan.options, a, P::run_on(ctx)),
                   "joint_lattice gradient");
}

// The handlers of platform P, named k<Op><SUFFIX>.
#define TF_RNNT_JOINT_FFI_INPUTS \
  Arg<ffi::AnyBuffer>()          \
      .Arg<ffi::AnyBuffer>()     \
      .Arg<ffi::AnyBuffer>()     \
      .Arg<ffi::AnyBuffer>()     \
      .Arg<I32>()                \
      .Arg<I32>()                \
      .Arg<I32>()

#define TF_RNNT_FFI_HANDLERS(P, SUFFIX)                                               \
  XLA_FFI_DEFINE_HANDLER(kLatticeLoss##SUFFIX, lattice_loss_ffi<P>,                   \
                         ffi::Ffi::Bind()                                             \
                             .Arg<F32>()                                              \
                             .Arg<I32>()                                              \
                             .Arg<I32>()                                              \
                             .Ret<ffi::Buffer<ffi::F32>>()                            \
                             .Ret<ffi::Buffer<ffi::F32>>()                            \
                             .Ret<ffi::AnyBuffer>()                                   \
                             .Attr<float>("fastemit_lambda")                          \
                             .Attr<float>("clamp")                                    \
                             .Ctx<P::CtxBinding>());                                  \
  XLA_FFI_DEFINE_HANDLER(kLogitsToLattice##SUFFIX, logits_to_lattice_ffi<P>,          \
                         ffi::Ffi::Bind()                                             \
                             .Arg<ffi::AnyBuffer>()                                   \
                             .Arg<I32>()                                              \
                             .Arg<I32>()                                              \
                             .Ret<ffi::Buffer<ffi::F32>>()                            \
                             .Ret<ffi::Buffer<ffi::F32>>()                            \
                             .Attr<int64_t>("blank")                                  \
                             .Attr<int64_t>("validate")                               \
                             .Ctx<P::CtxBinding>());                                  \
  XLA_FFI_DEFINE_HANDLER(kLogitsToLatticeGrad##SUFFIX, logits_to_lattice_grad_ffi<P>, \
                         ffi::Ffi::Bind()                                             \
                             .Arg<ffi::AnyBuffer>()                                   \
                             .Arg<I32>()                                              \
                             .Arg<F32>()                                              \
                             .Arg<F32>()                                              \
                             .Ret<ffi::AnyBuffer>()                                   \
                             .Attr<int64_t>("blank")                                  \
                             .Ctx<P::CtxBinding>());                                  \
  XLA_FFI_DEFINE_HANDLER(kJointLattice##SUFFIX, joint_lattice_ffi<P>,                 \
                         ffi::Ffi::Bind()                                             \
                             .TF_RNNT_JOINT_FFI_INPUTS.Ret<ffi::Buffer<ffi::F32>>()   \
                             .Ret<ffi::Buffer<ffi::F32>>()                            \
                             .Ret<ffi::AnyBuffer>()                                   \
                             .Attrs<TfRnntJointFfiAttrs>()                            \
                             .Ctx<P::CtxBinding>());                                  \
  XLA_FFI_DEFINE_HANDLER(kJointLatticeGrad##SUFFIX, joint_lattice_grad_ffi<P>,        \
                         ffi::Ffi::Bind()                                             \
                             .TF_RNNT_JOINT_FFI_INPUTS.Arg<F32>()                     \
                             .Arg<F32>()                                              \
                             .Ret<ffi::AnyBuffer>()                                   \
                             .Ret<ffi::AnyBuffer>()                                   \
                             .Ret<ffi::AnyBuffer>()                                   \
                             .Ret<ffi::AnyBuffer>()                                   \
                             .Ret<ffi::AnyBuffer>()                                   \
                             .Attrs<TfRnntJointFfiAttrs>()                            \
                             .Ctx<P::CtxBinding>());

TF_RNNT_FFI_HANDLERS(HostPlatform, Host)
#if TF_RNNT_WITH_CUDA
TF_RNNT_FFI_HANDLERS(CudaPlatform, Cuda)
#endif

// ------------------------------------------------------------------ registration
// Registers the handlers of one platform, named k<Op><SUFFIX> above.
#define TF_RNNT_REGISTER_FFI_HANDLERS(api, platform, SUFFIX)                                       \
  register_handler(api, "tf_rnnt_lattice_loss", platform, kLatticeLoss##SUFFIX);                   \
  register_handler(api, "tf_rnnt_logits_to_lattice", platform, kLogitsToLattice##SUFFIX);          \
  register_handler(api, "tf_rnnt_logits_to_lattice_grad", platform, kLogitsToLatticeGrad##SUFFIX); \
  register_handler(api, "tf_rnnt_joint_lattice", platform, kJointLattice##SUFFIX);                 \
  register_handler(api, "tf_rnnt_joint_lattice_grad", platform, kJointLatticeGrad##SUFFIX);

const bool kHandlersRegistered = [] {
  const XLA_FFI_Api* api = XLA_FFI_GetApi();
  TF_RNNT_REGISTER_FFI_HANDLERS(api, "Host", Host)
#if TF_RNNT_WITH_CUDA
  TF_RNNT_REGISTER_FFI_HANDLERS(api, "CUDA", Cuda)
#endif
  return true;
}();

}  // namespace
}  // namespace tf_rnnt
