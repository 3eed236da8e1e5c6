// TensorFlow glue of the TDT lattice loss (tdt_core.h): registration, shape function and the
// CPU/GPU kernels. Lengths are also passed as host copies (HostMemory on the GPU) so the kernel
// validates them without reading device memory back.
#include <algorithm>
#include <climits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernel_shared.h"
#include "shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tf_rnnt/tdt_core.h"

namespace tf_rnnt {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace tdt_lattice_loss_in {
enum : int { kLattice, kLogitLengths, kLabelLengths, kLogitLengthsHost, kLabelLengthsHost };
}  // namespace tdt_lattice_loss_in

REGISTER_OP("TfRnntTdtLatticeLoss")
    .Input("lattice: float")
    .Input("logit_lengths: int32")
    .Input("label_lengths: int32")
    .Input("logit_lengths_host: int32")
    .Input("label_lengths_host: int32")
    .Attr("durations: list(int)")
    .Attr("fastemit_lambda: float = 0.0")
    .Attr("clamp: float = -1.0")
    .Output("costs: float")
    .Output("grads: float")
    .SetShapeFn([](InferenceContext* c) {
      using namespace tdt_lattice_loss_in;  // NOLINT: the input names
      std::vector<int64_t> durations;
      TF_RETURN_IF_ERROR(c->GetAttr("durations", &durations));
      ShapeHandle lattice;
      DimensionHandle batch, channels;
      TF_RETURN_IF_ERROR(batch_dim(
          c, kLattice, 4, {kLogitLengths, kLabelLengths, kLogitLengthsHost, kLabelLengthsHost},
          &batch, &lattice));
      TF_RETURN_IF_ERROR(c->WithValue(c->Dim(lattice, 3), 2 + durations.size(), &channels));
      TF_RETURN_IF_ERROR(c->ReplaceDim(lattice, 0, batch, &lattice));
      c->set_output(0, c->Vector(batch));
      c->set_output(1, lattice);
      return ::tensorflow::Status();
    })
    .Doc(R"doc(TDT costs of a [B, T, U+1, 2 + D] lattice and d cost / d lattice.

The channels are log P(blank) - sigma, log P(y_{u+1}) - sigma, then log P(durations[i]).
)doc");

namespace {

// The options from the op's attributes (the context failed when they are bad).
void tdt_options(OpKernelConstruction* ctx, TdtLossOptions* options) {
  std::vector<int64_t> durations;
  OP_REQUIRES_OK(ctx, ctx->GetAttr("durations", &durations));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("fastemit_lambda", &options->fastemit_lambda));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("clamp", &options->clamp));
  OP_REQUIRES(
      ctx,
      !durations.empty() && durations.size() <= kTdtMaxDurations && durations.back() <= INT32_MAX,
      InvalidArgument("durations must hold 1 to ", kTdtMaxDurations, " int32 values, got ",
                      durations.size()));
  options->num_durations = static_cast<int>(durations.size());
  for (size_t i = 0; i < durations.size(); ++i) {
    // Values below int32 keep their sign, so the check below rejects them.
    options->durations[i] = static_cast<int>(std::max<int64_t>(durations[i], -1));
  }
  const char* error = tdt_options_error(*options);
  OP_REQUIRES(ctx, error == nullptr, InvalidArgument(error ? error : ""));
}

// Runs the device's launcher: the CPU one reads the host copies of the lengths, the CUDA one the
// device inputs.
template <typename Device>
Status tdt_launch(OpKernelContext* ctx, const float* lattice, int B, int T, int U1,
                  const TdtLossOptions& options, float* costs, float* grads, float* alphas,
                  float* betas) {
  using namespace tdt_lattice_loss_in;  // NOLINT: the input names
#if TF_RNNT_WITH_CUDA
  if constexpr (std::is_same_v<Device, GpuDevice>) {
    return tdt_lattice_loss_cuda(lattice, ctx->input(kLogitLengths).flat<int32_t>().data(),
                                 ctx->input(kLabelLengths).flat<int32_t>().data(), B, T, U1,
                                 options, costs, grads, alphas, betas, gpu_stream(ctx));
  }
#endif
  return tdt_lattice_loss_cpu(lattice, ctx->input(kLogitLengthsHost).flat<int32_t>().data(),
                              ctx->input(kLabelLengthsHost).flat<int32_t>().data(), B, T, U1,
                              options, costs, grads, alphas, betas, cpu_parallel_for(ctx));
}

template <typename Device>
class TdtLatticeLossOp : public OpKernel {
 public:
  explicit TdtLatticeLossOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    tdt_options(ctx, &options_);
  }

  void Compute(OpKernelContext* ctx) override {
    using namespace tdt_lattice_loss_in;  // NOLINT: the input names
    const Tensor& lattice = ctx->input(kLattice);
    const int64_t C = 2 + options_.num_durations;
    OP_REQUIRES(
        ctx, lattice.dims() == 4 && lattice.dim_size(3) == C,
        InvalidArgument("lattice must have shape [B, T, U+1, ", C,
                        "] (2 + the number of durations), got ", lattice.shape().DebugString()));
    const int64_t B = lattice.dim_size(0), T = lattice.dim_size(1), U1 = lattice.dim_size(2);
    for (int i : {kLogitLengths, kLabelLengths, kLogitLengthsHost, kLabelLengthsHost}) {
      const Tensor& lengths = ctx->input(i);
      OP_REQUIRES(
          ctx, lengths.dims() == 1 && lengths.dim_size(0) == B,
          InvalidArgument(i % 2 == 1 ? "logit_lengths" : "label_lengths", " must have shape [", B,
                          "] (the batch size), got ", lengths.shape().DebugString()));
    }
    const std::string error =
        lengths_error(ctx->input(kLogitLengthsHost).flat<int32_t>().data(),
                      ctx->input(kLabelLengthsHost).flat<int32_t>().data(), B, T, U1 - 1);
    OP_REQUIRES(ctx, error.empty(), InvalidArgument(error));
    Tensor* costs = nullptr;
    Tensor* grads = nullptr;
    Tensor alphas, betas;
    allocate_lattice_loss(ctx, lattice, &costs, &grads, &alphas, &betas);
    if (!ctx->status().ok() || B == 0) return;
    const Status s = tdt_launch<Device>(ctx, lattice.flat<float>().data(), static_cast<int>(B),
                                        static_cast<int>(T), static_cast<int>(U1), options_,
                                        costs->flat<float>().data(), grads->flat<float>().data(),
                                        alphas.flat<float>().data(), betas.flat<float>().data());
    OP_REQUIRES(ctx, s.ok(), to_tf_status(s, "tdt_lattice_loss"));
  }

 private:
  TdtLossOptions options_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("TfRnntTdtLatticeLoss").Device(::tensorflow::DEVICE_CPU),
                        TdtLatticeLossOp<CpuDevice>);
#if TF_RNNT_WITH_CUDA
REGISTER_KERNEL_BUILDER(Name("TfRnntTdtLatticeLoss")
                            .Device(::tensorflow::DEVICE_GPU)
                            .HostMemory("logit_lengths_host")
                            .HostMemory("label_lengths_host"),
                        TdtLatticeLossOp<GpuDevice>);
#endif

}  // namespace tf_rnnt
