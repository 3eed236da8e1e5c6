// TensorFlow glue: validate with OP_REQUIRES, allocate through TensorFlow, call the
// framework-free core (custom_ops/core) through CoreFunctor<Device>, which runs it on the op's
// thread pool (CPU) or CUDA stream (GPU).
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernel_shared.h"
#include "op_inputs.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {

using ::tensorflow::AllocatorAttributes;
using ::tensorflow::DataType;
using ::tensorflow::DEVICE_CPU;
using ::tensorflow::errors::ResourceExhausted;

namespace {

// OP_REQUIRES for helpers that return false on failure.
#define TF_RNNT_REQUIRE(ctx, cond, ret, status)      \
  do {                                               \
    if (!(cond)) {                                   \
      (ctx)->CtxFailure(__FILE__, __LINE__, status); \
      return ret;                                    \
    }                                                \
  } while (0)

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

// The shapes of an op's inputs (kernel_shared.h's shape checks).
Dims dims_of(const Tensor& t) {
  const auto d = t.shape().dim_sizes();
  return Dims(d.begin(), d.end());
}

// `error` (a shape check's result) as the op's failure; false when it is not empty.
bool shapes_ok(OpKernelContext* ctx, const std::string& error) {
  TF_RNNT_REQUIRE(ctx, error.empty(), false, InvalidArgument(error));
  return true;
}

// logit_lengths in [1, T], label_lengths in [0, U], both [B] (shapes checked).
bool validate_lengths(OpKernelContext* ctx, const Tensor& logit_lengths,
                      const Tensor& label_lengths, int64_t B, int64_t T, int64_t U1) {
  const std::string error = lengths_error(logit_lengths.flat<int32_t>().data(),
                                          label_lengths.flat<int32_t>().data(), B, T, U1 - 1);
  TF_RNNT_REQUIRE(ctx, error.empty(), false, InvalidArgument(error));
  return true;
}

// labels[b, u] for u < label_lengths[b] in [0, V) and != blank.
bool validate_labels(OpKernelContext* ctx, const Tensor& labels, const Tensor& label_lengths,
                     int64_t V, int blank) {
  const std::string error =
      labels_error(labels.matrix<int32_t>().data(), label_lengths.flat<int32_t>().data(),
                   labels.dim_size(0), labels.dim_size(1), V, blank);
  TF_RNNT_REQUIRE(ctx, error.empty(), false, InvalidArgument(error));
  return true;
}

// ------------------------------------------------------------------ devices
// The core's launchers for one device (the tensorflow custom-op functor pattern).
template <typename Device>
struct CoreFunctor;

// CoreFunctor's methods: name(args...) calls the device's launcher name_<suffix>(args...), adding
// `runner` (the thread pool or the stream) where the launcher runs work.
#define TF_RNNT_CORE_LAUNCHERS(suffix, runner)                             \
  template <typename... A>                                                 \
  Status lattice_loss(A&&... a) const {                                    \
    return lattice_loss_##suffix(std::forward<A>(a)..., runner);           \
  }                                                                        \
  template <typename... A>                                                 \
  Status logits_to_lattice(A&&... a) const {                               \
    return logits_to_lattice_##suffix(std::forward<A>(a)..., runner);      \
  }                                                                        \
  template <typename... A>                                                 \
  Status logits_to_lattice_grad(A&&... a) const {                          \
    return logits_to_lattice_grad_##suffix(std::forward<A>(a)..., runner); \
  }                                                                        \
  template <typename... A>                                                 \
  Status joint_forward(A&&... a) const {                                   \
    return joint_forward_##suffix(std::forward<A>(a)..., runner);          \
  }                                                                        \
  template <typename... A>                                                 \
  Status joint_backward(A&&... a) const {                                  \
    return joint_backward_##suffix(std::forward<A>(a)..., runner);         \
  }                                                                        \
  template <typename... A>                                                 \
  static JointSavedSizes joint_saved_sizes(A&&... a) {                     \
    return joint_saved_sizes_##suffix(std::forward<A>(a)...);              \
  }

template <>
struct CoreFunctor<CpuDevice> {
  static constexpr bool kGpu = false;
  // The untiled backward only reads the kept joint values (JointBackwardArgs::saved_hidden).
  static constexpr bool kOverwritesSavedHidden = false;

  explicit CoreFunctor(OpKernelContext* ctx) : parallel_for(cpu_parallel_for(ctx)) {}

  // The lengths the launchers read: the host copies.
  static const int32_t* lengths(OpKernelContext* ctx, int /*device_input*/, int host_input) {
    return ctx->input(host_input).flat<int32_t>().data();
  }

  // The joint's labels and lengths (host tensors) as the launchers read them: in place.
  Status stage_ints(OpKernelContext* /*ctx*/, const Tensor* const (&host)[3], Tensor* /*staged*/,
                    const int32_t* (&out)[3]) const {
    for (int i = 0; i < 3; ++i) out[i] = host[i]->flat<int32_t>().data();
    return Status();
  }

  TF_RNNT_CORE_LAUNCHERS(cpu, parallel_for)
  Status copy(void* dst, const void* src, size_t bytes) const {
    std::memcpy(dst, src, bytes);
    return Status();
  }

  ParallelFor parallel_for;
};

#if TF_RNNT_WITH_CUDA
template <>
struct CoreFunctor<GpuDevice> {
  static constexpr bool kGpu = true;
  // The untiled backward writes d hidden over the kept joint values.
  static constexpr bool kOverwritesSavedHidden = true;

  explicit CoreFunctor(OpKernelContext* ctx) : stream(gpu_stream(ctx)) {}

  // The lengths the launchers read: the device copies (the host copies only plan and validate).
  static const int32_t* lengths(OpKernelContext* ctx, int device_input, int /*host_input*/) {
    return ctx->input(device_input).flat<int32_t>().data();
  }

  // The joint's labels and lengths (host tensors) as the launchers read them: uploaded into
  // `staged` on the op's stream. TensorFlow's own copy of the device inputs would keep the op
  // from starting until its event poller reports the copy done.
  Status stage_ints(OpKernelContext* ctx, const Tensor* const (&host)[3], Tensor* staged,
                    const int32_t* (&out)[3]) const {
    std::vector<int32_t> packed;
    for (const Tensor* t : host) {
      packed.insert(packed.end(), t->flat<int32_t>().data(),
                    t->flat<int32_t>().data() + t->NumElements());
    }
    const auto allocated = ctx->allocate_temp(
        ::tensorflow::DT_INT32, TensorShape({static_cast<int64_t>(packed.size())}), staged);
    if (!allocated.ok()) {
      Status s;
      s.code = StatusCode::kResourceExhausted;
      s.message = "could not allocate the labels and lengths on the GPU";
      return s;
    }
    int32_t* device = staged->flat<int32_t>().data();
    for (int i = 0, offset = 0; i < 3; offset += host[i]->NumElements(), ++i) {
      out[i] = device + offset;
    }
    return upload_cuda(device, packed.data(), packed.size() * sizeof(int32_t), stream);
  }

  TF_RNNT_CORE_LAUNCHERS(cuda, stream)
  Status copy(void* dst, const void* src, size_t bytes) const {
    return copy_cuda(dst, src, bytes, stream);
  }

  GpuStream stream;
};
#endif

void* mutable_data(Tensor* t) { return const_cast<char*>(t->tensor_data().data()); }

// ------------------------------------------------------------------ lattice loss
template <typename Device>
class LatticeLossOp : public OpKernel {
 public:
  explicit LatticeLossOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("fastemit_lambda", &options_.fastemit_lambda));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("clamp", &options_.clamp));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("validate_lengths", &validate_));
  }

  void Compute(OpKernelContext* ctx) override {
    using namespace lattice_loss_in;  // NOLINT: the input names
    const Tensor& lattice = ctx->input(kLattice);
    // Validated lengths are read from the host copies, else from the device inputs only.
    const int logit_in = validate_ ? kLogitLengthsHost : kLogitLengths;
    const int label_in = validate_ ? kLabelLengthsHost : kLabelLengths;
    if (!shapes_ok(ctx, lattice_loss_shapes_error(dims_of(lattice), dims_of(ctx->input(logit_in)),
                                                  dims_of(ctx->input(label_in)), validate_))) {
      return;
    }
    const int64_t B = lattice.dim_size(0), T = lattice.dim_size(1), U1 = lattice.dim_size(2);
    // Unvalidated lengths in [0, T] and [0, U] keep every read in bounds once T, U+1 >= 1.
    if (validate_ && !validate_lengths(ctx, ctx->input(logit_in), ctx->input(label_in), B, T, U1)) {
      return;
    }
    Tensor* costs = nullptr;
    Tensor* grads = nullptr;
    Tensor alphas, betas;
    allocate_lattice_loss(ctx, lattice, &costs, &grads, &alphas, &betas);
    if (!ctx->status().ok() || B == 0) return;
    const CoreFunctor<Device> core(ctx);
    // Unvalidated lengths are read from the device inputs only (host memory on the CPU).
    const int32_t* logit_lengths = validate_ ? core.lengths(ctx, kLogitLengths, kLogitLengthsHost)
                                             : ctx->input(kLogitLengths).flat<int32_t>().data();
    const int32_t* label_lengths = validate_ ? core.lengths(ctx, kLabelLengths, kLabelLengthsHost)
                                             : ctx->input(kLabelLengths).flat<int32_t>().data();
    const Status s =
        core.lattice_loss(lattice.flat<float>().data(), logit_lengths, label_lengths, B, T, U1,
                          options_, costs->flat<float>().data(), grads->flat<float>().data(),
                          alphas.flat<float>().data(), betas.flat<float>().data());
    OP_REQUIRES_OK(ctx, to_tf_status(s, "lattice_loss"));
  }

 private:
  LatticeLossOptions options_;
  bool validate_ = true;
};

// ------------------------------------------------------------------ logits -> lattice
template <typename Device>
class LogitsToLatticeOp : public OpKernel {
 public:
  explicit LogitsToLatticeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("blank", &blank_attr_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("validate_labels", &validate_));
  }

  void Compute(OpKernelContext* ctx) override {
    using namespace logits_to_lattice_in;  // NOLINT: the input names
    const Tensor& logits = ctx->input(kLogits);
    const Tensor& labels = ctx->input(kLabels);
    const Tensor& lengths = ctx->input(kLabelLengthsHost);
    const Dims lengths_dims = dims_of(lengths);
    if (!shapes_ok(ctx, logits_to_lattice_shapes_error(dims_of(logits), dims_of(labels),
                                                       validate_ ? &lengths_dims : nullptr))) {
      return;
    }
    const int64_t B = logits.dim_size(0), T = logits.dim_size(1), U1 = logits.dim_size(2),
                  V = logits.dim_size(3);
    int blank;
    if (!normalize_blank(ctx, blank_attr_, V, &blank)) return;
    if (validate_) {
      const std::string error =
          lengths_error(nullptr, lengths.flat<int32_t>().data(), B, T, U1 - 1);
      OP_REQUIRES(ctx, error.empty(), InvalidArgument(error));
      if (!validate_labels(ctx, ctx->input(kLabelsHost), lengths, V, blank)) return;
    }
    Tensor* lattice = nullptr;
    Tensor* lse = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({B, T, U1, 2}), &lattice));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({B, T, U1}), &lse));
    const Status s = CoreFunctor<Device>(ctx).logits_to_lattice(
        logits.tensor_data().data(), core_dtype(logits.dtype()), labels.flat<int32_t>().data(), B,
        T, U1, V, blank, lattice->flat<float>().data(), lse->flat<float>().data());
    OP_REQUIRES_OK(ctx, to_tf_status(s, "logits_to_lattice"));
  }

 private:
  int blank_attr_;
  bool validate_;
};

template <typename Device>
class LogitsToLatticeGradOp : public OpKernel {
 public:
  explicit LogitsToLatticeGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("blank", &blank_attr_));
  }

  void Compute(OpKernelContext* ctx) override {
    using namespace logits_to_lattice_grad_in;  // NOLINT: the input names
    const Tensor& logits = ctx->input(kLogits);
    const int64_t B = logits.dim_size(0), T = logits.dim_size(1), U1 = logits.dim_size(2),
                  V = logits.dim_size(3);
    int blank;
    if (!normalize_blank(ctx, blank_attr_, V, &blank)) return;
    OP_REQUIRES(ctx, ctx->input(kDLattice).NumElements() == B * T * U1 * 2,
                InvalidArgument("d_lattice must have shape [B, T, U+1, 2]"));
    // d logits overwrites the logits' buffer when TensorFlow can forward it.
    Tensor* d_logits = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->forward_input_or_allocate_output({kLogits}, 0, logits.shape(), &d_logits));
    const Status s = CoreFunctor<Device>(ctx).logits_to_lattice_grad(
        logits.tensor_data().data(), core_dtype(logits.dtype()),
        ctx->input(kLabels).flat<int32_t>().data(), B, T, U1, V, blank,
        ctx->input(kLse).flat<float>().data(), ctx->input(kDLattice).flat<float>().data(),
        mutable_data(d_logits));
    OP_REQUIRES_OK(ctx, to_tf_status(s, "logits_to_lattice gradient"));
  }

 private:
  int blank_attr_;
};

// ------------------------------------------------------------------ fused joint
// Shapes, validation, the packed-node plan and the workspace shared by the forward and backward
// kernels.
template <typename Device>
struct JointPlan {
  using Core = CoreFunctor<Device>;
  JointShape shape;
  JointOptions options;
  std::vector<int64_t> host_offsets;
  Tensor staged_ints;  // the labels and lengths on the GPU
  JointInputs in;      // in.host.tile_nodes is set by allocate_workspace

  // host_lengths: the input index of the host logit lengths (label lengths follow it).
  bool init(OpKernelContext* ctx, const JointAttrs& attrs, int host_lengths) {
    const Tensor& logit_lengths_host = ctx->input(host_lengths);
    const Tensor& label_lengths_host = ctx->input(host_lengths + 1);
    const Tensor& enc = ctx->input(joint_in::kEncoder);
    const Tensor& pred = ctx->input(joint_in::kPredictor);
    const Tensor& kernel = ctx->input(joint_in::kKernel);
    const Tensor& bias = ctx->input(joint_in::kBias);
    const Tensor& labels = ctx->input(joint_in::kLabels);
    if (!shapes_ok(ctx,
                   joint_shapes_error(dims_of(enc), dims_of(pred), dims_of(kernel), dims_of(bias),
                                      dims_of(labels), dims_of(logit_lengths_host),
                                      dims_of(label_lengths_host), attrs.num_durations))) {
      return false;
    }
    const int64_t B = enc.dim_size(0), T = enc.dim_size(1), H = enc.dim_size(2);
    const int64_t U1 = pred.dim_size(1), V = kernel.dim_size(1);
    if (!validate_lengths(ctx, logit_lengths_host, label_lengths_host, B, T, U1)) return false;
    shape.B = static_cast<int>(B);
    shape.T = static_cast<int>(T);
    shape.U1 = static_cast<int>(U1);
    shape.H = static_cast<int>(H);
    shape.V = static_cast<int>(V);
    shape.D = attrs.num_durations;
    if (!normalize_blank(ctx, attrs.blank_attr, token_columns(shape), &options.blank)) {
      return false;
    }
    options.activation = attrs.activation;
    options.dtype = core_dtype(enc.dtype());
    options.allow_tf32 = attrs.allow_tf32;
    options.kernel = attrs.kernel;
    in.host = host_plan(logit_lengths_host.flat<int32_t>().data(),
                        label_lengths_host.flat<int32_t>().data(), shape.B, &host_offsets);
    in.encoder = enc.tensor_data().data();
    in.predictor = pred.tensor_data().data();
    in.kernel = kernel.tensor_data().data();
    in.bias = bias.tensor_data().data();
    const Tensor* const host_ints[3] = {&labels, &logit_lengths_host, &label_lengths_host};
    const int32_t* ints[3];
    const Status staged = Core(ctx).stage_ints(ctx, host_ints, &staged_ints, ints);
    TF_RNNT_REQUIRE(ctx, staged.ok(), false, to_tf_status(staged, "joint_lattice"));
    in.labels = ints[0];
    in.logit_lengths = ints[1];
    in.label_lengths = ints[2];
    return true;
  }

  int64_t num_nodes() const { return in.host.num_nodes; }

  // Allocates the workspace, halving the tile while the allocation fails; sets in.host.tile_nodes.
  bool allocate_workspace(OpKernelContext* ctx, const JointAttrs& attrs, bool backward,
                          Tensor* workspace) {
    JointPassPlan plan;
    const Status planned = plan_joint_pass(shape, options, num_nodes(), attrs.tile_request(true),
                                           backward, Core::kGpu, &plan);
    TF_RNNT_REQUIRE(ctx, planned.ok(), false, to_tf_status(planned, "joint_lattice"));
    int64_t tile = plan.tile_nodes;
    for (;;) {
      const size_t bytes =
          tile == plan.tile_nodes
              ? plan.workspace_bytes
              : joint_workspace_bytes(shape, options, tile, backward, attrs.untiled, Core::kGpu);
      // No retry: a failed allocation makes us halve the tile instead of waiting.
      ::tensorflow::AllocationAttributes no_retry(false, true, nullptr);
      const auto status = ctx->allocate_temp(
          ::tensorflow::DT_INT8, TensorShape({static_cast<int64_t>(std::max<size_t>(bytes, 1))}),
          workspace, AllocatorAttributes(), no_retry);
      if (status.ok()) break;
      TF_RNNT_REQUIRE(ctx, !attrs.untiled && tile > 1024, false,
                      ResourceExhausted("tf_rnnt.joint_lattice could not allocate its ", bytes,
                                        "-byte workspace (", tile, " lattice nodes per tile",
                                        attrs.untiled ? ", untiled mode" : "",
                                        "). Use mode='tiled' with a smaller tile_size or "
                                        "memory_budget, or a smaller batch."));
      tile /= 2;
    }
    in.host.tile_nodes = tile;
    return true;
  }
};

template <typename Device>
class JointLatticeOp : public OpKernel {
 public:
  explicit JointLatticeOp(OpKernelConstruction* ctx) : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    using namespace joint_in;  // NOLINT: the input names
    JointPlan<Device> plan;
    if (!plan.init(ctx, attrs_, kLogitLengthsHost)) return;
    const JointShape& s = plan.shape;
    if (!validate_labels(ctx, ctx->input(kLabelsHost), ctx->input(kLabelLengthsHost),
                         token_columns(s), plan.options.blank)) {
      return;
    }
    Tensor* lattice = nullptr;
    Tensor* lse = nullptr;
    Tensor* saved[2] = {nullptr, nullptr};
    const int64_t N = plan.num_nodes();
    OP_REQUIRES_OK(
        ctx, ctx->allocate_output(0, TensorShape({s.B, s.T, s.U1, lattice_channels(s)}), &lattice));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({N}), &lse));
    // Untiled mode keeps the joint values and logits of all N nodes: say what to change if they
    // don't fit. Tiled mode keeps nothing.
    const JointSavedSizes kept =
        CoreFunctor<Device>::joint_saved_sizes(s, plan.options, attrs_.untiled ? N : 0);
    for (int i : {0, 1}) {
      const int64_t elements = i == 0 ? kept.hidden : kept.logits;
      const auto st = ctx->allocate_output(2 + i, TensorShape({elements}), &saved[i]);
      OP_REQUIRES(ctx, st.ok(),
                  ResourceExhausted("tf_rnnt.joint_lattice (mode='untiled') could not keep the ",
                                    (i == 0 ? "joint values" : "logits"), " of its ", N,
                                    " lattice nodes (", elements,
                                    " elements). Use mode='tiled' "
                                    "(with tile_size or memory_budget), or a smaller batch. (",
                                    st.message(), ")"));
    }
    if (s.B == 0) return;
    Tensor workspace;
    if (!plan.allocate_workspace(ctx, attrs_, false, &workspace)) return;
    JointForwardArgs a;
    a.in = plan.in;
    a.workspace = mutable_data(&workspace);
    a.lattice = lattice->flat<float>().data();
    a.lse = lse->flat<float>().data();
    a.saved_hidden = attrs_.untiled ? mutable_data(saved[0]) : nullptr;
    a.saved_logits = attrs_.untiled ? saved[1]->flat<float>().data() : nullptr;
    const Status st = CoreFunctor<Device>(ctx).joint_forward(s, plan.options, a);
    OP_REQUIRES_OK(ctx, to_tf_status(st, "joint_lattice"));
  }

 private:
  JointAttrs attrs_;
};

template <typename Device>
class JointLatticeGradOp : public OpKernel {
 public:
  explicit JointLatticeGradOp(OpKernelConstruction* ctx) : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    using namespace joint_grad_in;  // NOLINT: the input names
    JointPlan<Device> plan;
    if (!plan.init(ctx, attrs_, kLogitLengthsHost)) return;
    const int64_t N = plan.num_nodes();
    const CoreFunctor<Device> core(ctx);
    Tensor* grads[4];
    for (int i = 0; i < 4; ++i) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, ctx->input(i).shape(), &grads[i]));
    }
    // An empty batch still runs the launcher, which zeroes d kernel and d bias.
    OP_REQUIRES(ctx, ctx->input(kLse).NumElements() == N,
                InvalidArgument("lse must have ", N, " elements"));
    const JointShape& s = plan.shape;
    const TensorShape lattice_shape({s.B, s.T, s.U1, lattice_channels(s)});
    OP_REQUIRES(ctx, ctx->input(kDLattice).shape() == lattice_shape,
                InvalidArgument("d_lattice must have shape ", lattice_shape.DebugString(), ", got ",
                                ctx->input(kDLattice).shape().DebugString()));
    // Untiled mode: d logits overwrite the kept logits, and on the GPU d hidden the kept joint
    // values, in buffers TensorFlow forwards when it can, else in private copies (for example of
    // a persistent tape's tensors).
    Tensor saved_hidden, saved_logits;
    if (attrs_.untiled) {
      const JointSavedSizes sizes = core.joint_saved_sizes(plan.shape, plan.options, N);
      OP_REQUIRES(ctx, ctx->input(kSavedHidden).NumElements() == sizes.hidden,
                  InvalidArgument("saved_hidden must have ", sizes.hidden, " elements"));
      OP_REQUIRES(ctx, ctx->input(kSavedLogits).NumElements() == sizes.logits,
                  InvalidArgument("saved_logits must have ", sizes.logits, " elements"));
      for (auto [index, out] :
           {std::pair{kSavedHidden, &saved_hidden}, std::pair{kSavedLogits, &saved_logits}}) {
        const Tensor& kept = ctx->input(index);
        if (index == kSavedHidden && !CoreFunctor<Device>::kOverwritesSavedHidden) {
          *out = kept;  // read only
          continue;
        }
        std::unique_ptr<Tensor> forwarded =
            ctx->forward_input(index, OpKernelContext::Params::kNoReservation, kept.dtype(),
                               kept.shape(), ::tensorflow::DEVICE_MEMORY, AllocatorAttributes());
        if (forwarded) {
          *out = *forwarded;
          continue;
        }
        OP_REQUIRES_OK(ctx, ctx->allocate_temp(kept.dtype(), kept.shape(), out));
        OP_REQUIRES_OK(ctx, to_tf_status(core.copy(mutable_data(out), kept.tensor_data().data(),
                                                   kept.TotalBytes()),
                                         "joint_lattice gradient"));
      }
    }
    Tensor workspace;
    if (!plan.allocate_workspace(ctx, attrs_, true, &workspace)) return;
    JointBackwardArgs a;
    a.in = plan.in;
    a.workspace = mutable_data(&workspace);
    a.lse = ctx->input(kLse).flat<float>().data();
    a.d_lattice = ctx->input(kDLattice).flat<float>().data();
    a.saved_hidden = attrs_.untiled ? mutable_data(&saved_hidden) : nullptr;
    a.saved_logits = attrs_.untiled ? saved_logits.flat<float>().data() : nullptr;
    a.d_encoder = mutable_data(grads[0]);
    a.d_predictor = mutable_data(grads[1]);
    a.d_kernel = mutable_data(grads[2]);
    a.d_bias = mutable_data(grads[3]);
    OP_REQUIRES_OK(ctx, to_tf_status(core.joint_backward(plan.shape, plan.options, a),
                                     "joint_lattice gradient"));
  }

 private:
  JointAttrs attrs_;
};

}  // namespace

#define REGISTER_FLOAT_KERNELS(NAME, OP, DEVICE, DEVICE_TYPE, ...)                              \
  REGISTER_KERNEL_BUILDER(Name(NAME).Device(DEVICE).TypeConstraint<float>("dtype") __VA_ARGS__, \
                          OP<DEVICE_TYPE>);                                                     \
  REGISTER_KERNEL_BUILDER(                                                                      \
      Name(NAME).Device(DEVICE).TypeConstraint<::Eigen::half>("dtype") __VA_ARGS__,             \
      OP<DEVICE_TYPE>);                                                                         \
  REGISTER_KERNEL_BUILDER(                                                                      \
      Name(NAME).Device(DEVICE).TypeConstraint<::tensorflow::bfloat16>("dtype") __VA_ARGS__,    \
      OP<DEVICE_TYPE>);

REGISTER_KERNEL_BUILDER(Name("TfRnntLatticeLoss").Device(DEVICE_CPU), LatticeLossOp<CpuDevice>);
REGISTER_FLOAT_KERNELS("TfRnntLogitsToLattice", LogitsToLatticeOp, DEVICE_CPU, CpuDevice)
REGISTER_FLOAT_KERNELS("TfRnntLogitsToLatticeGrad", LogitsToLatticeGradOp, DEVICE_CPU, CpuDevice)
REGISTER_FLOAT_KERNELS("TfRnntJointLattice", JointLatticeOp, DEVICE_CPU, CpuDevice)
REGISTER_FLOAT_KERNELS("TfRnntJointLatticeGrad", JointLatticeGradOp, DEVICE_CPU, CpuDevice)

#if TF_RNNT_WITH_CUDA
using ::tensorflow::DEVICE_GPU;
REGISTER_KERNEL_BUILDER(Name("TfRnntLatticeLoss")
                            .Device(DEVICE_GPU)
                            .HostMemory("logit_lengths_host")
                            .HostMemory("label_lengths_host"),
                        LatticeLossOp<GpuDevice>);
REGISTER_FLOAT_KERNELS("TfRnntLogitsToLattice", LogitsToLatticeOp, DEVICE_GPU, GpuDevice,
                       .HostMemory("labels_host").HostMemory("label_lengths_host"))
REGISTER_FLOAT_KERNELS("TfRnntLogitsToLatticeGrad", LogitsToLatticeGradOp, DEVICE_GPU, GpuDevice)
// The joint ops take every int32 input in host memory and upload what their kernels read
// (CoreFunctor<GpuDevice>::stage_ints).
REGISTER_FLOAT_KERNELS("TfRnntJointLattice", JointLatticeOp, DEVICE_GPU, GpuDevice,
                       .HostMemory("labels")
                           .HostMemory("logit_lengths")
                           .HostMemory("label_lengths")
                           .HostMemory("labels_host")
                           .HostMemory("logit_lengths_host")
                           .HostMemory("label_lengths_host"))
REGISTER_FLOAT_KERNELS("TfRnntJointLatticeGrad", JointLatticeGradOp, DEVICE_GPU, GpuDevice,
                       .HostMemory("labels")
                           .HostMemory("logit_lengths")
                           .HostMemory("label_lengths")
                           .HostMemory("logit_lengths_host")
                           .HostMemory("label_lengths_host"))
#endif

}  // namespace tf_rnnt
