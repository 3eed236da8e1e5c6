// XLA support of the TDT lattice loss: TfRnntTdtLatticeLoss lowers to the typed-FFI custom call
// "tf_rnnt_tdt_lattice_loss", whose Host and CUDA handlers call the same core launchers as the
// TensorFlow kernels (tdt_ops.cc). As in xla_lowering.cc, the XLA kernels are registered directly
// for the XLA_CPU_JIT / XLA_GPU_JIT devices, the alphas and betas are a workspace result of the
// call, and lengths are validated on the host (copied there on the GPU, which synchronizes the
// stream).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "kernel_shared.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tf_rnnt/tdt_core.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"
#include "xla/hlo/builder/xla_builder.h"
#include "xla/shape_util.h"
#include "xla_shared.h"

namespace tf_rnnt {
namespace {

namespace ffi = ::xla::ffi;
using ::tensorflow::XlaOpKernel;
using ::tensorflow::XlaOpKernelContext;
using ::tensorflow::errors::InvalidArgument;

constexpr char kTarget[] = "tf_rnnt_tdt_lattice_loss";

// ------------------------------------------------------------------ lowering
class TdtLatticeLossXla : public XlaOpKernel {
 public:
  explicit TdtLatticeLossXla(::tensorflow::OpKernelConstruction* ctx) : XlaOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("durations", &durations_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("fastemit_lambda", &fastemit_lambda_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("clamp", &clamp_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    auto shape = ctx->InputXlaShape(0);
    OP_REQUIRES_OK(ctx, shape.status());
    OP_REQUIRES(ctx, shape->dimensions().size() == 4 && shape->is_static(),
                InvalidArgument("lattice must have a static shape of rank 4 under XLA, got ",
                                shape->ToString()));
    const std::vector<int64_t> d(shape->dimensions().begin(), shape->dimensions().end());
    OP_REQUIRES(ctx, d[3] == 2 + static_cast<int64_t>(durations_.size()),
                InvalidArgument("lattice must have 2 + ", durations_.size(),
                                " channels (the number of durations), got ", shape->ToString()));
    // The backend config: an MLIR dictionary of the custom call's attributes.
    std::string config = "{durations = array<i64";
    for (size_t i = 0; i < durations_.size(); ++i) {
      config += (i == 0 ? ": " : ", ") + std::to_string(durations_[i]);
    }
    char floats[128];
    std::snprintf(floats, sizeof(floats), ">, fastemit_lambda = %.9e : f32, clamp = %.9e : f32}",
                  static_cast<double>(fastemit_lambda_), static_cast<double>(clamp_));
    config += floats;
    const auto f32 = [](std::vector<int64_t> dims) {
      return ::xla::ShapeUtil::MakeShape(::xla::F32, dims);
    };
    const int64_t workspace = std::max<int64_t>(1, 2 * sizeof(float) * d[0] * d[1] * d[2]);
    const ::xla::XlaOp call = ::xla::CustomCall(
        ctx->builder(), kTarget, {ctx->Input(0), ctx->Input(1), ctx->Input(2)},
        ::xla::ShapeUtil::MakeTupleShape(
            {f32({d[0]}), f32(d), ::xla::ShapeUtil::MakeShape(::xla::U8, {workspace})}),
        config, /*has_side_effect=*/false, /*output_operand_aliasing=*/{}, /*literal=*/nullptr,
        ::xla::CustomCallSchedule::SCHEDULE_NONE,
        ::xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
    ctx->SetOutput(0, ::xla::GetTupleElement(call, 0));
    ctx->SetOutput(1, ::xla::GetTupleElement(call, 1));
  }

 private:
  std::vector<int64_t> durations_;
  float fastemit_lambda_ = 0.f, clamp_ = -1.f;
};

REGISTER_KERNEL_BUILDER(Name("TfRnntTdtLatticeLoss").Device(::tensorflow::DEVICE_CPU_XLA_JIT),
                        TdtLatticeLossXla);
#if TF_RNNT_WITH_CUDA
REGISTER_KERNEL_BUILDER(Name("TfRnntTdtLatticeLoss").Device(::tensorflow::DEVICE_GPU_XLA_JIT),
                        TdtLatticeLossXla);
#endif

// ------------------------------------------------------------------ handlers
// Options, checked lengths and workspace shared by both handlers; the error is "" on success.
std::string prepare(ffi::Span<const int64_t> durations, float fastemit_lambda, float clamp,
                    const int32_t* logit_lengths, const int32_t* label_lengths, int64_t B,
                    int64_t T, int64_t U1, size_t workspace_bytes, TdtLossOptions* options) {
  if (durations.size() < 1 || durations.size() > kTdtMaxDurations) {
    return "tdt_lattice_loss: durations must hold 1 to 64 values";
  }
  options->num_durations = static_cast<int>(durations.size());
  for (size_t i = 0; i < durations.size(); ++i) {
    options->durations[i] = static_cast<int>(std::clamp<int64_t>(durations[i], -1, INT32_MAX));
  }
  options->fastemit_lambda = fastemit_lambda;
  options->clamp = clamp;
  if (const char* error = tdt_options_error(*options))
    return std::string("tdt_lattice_loss: ") + error;
  if (workspace_bytes < 2 * sizeof(float) * B * T * U1) {
    return "tdt_lattice_loss: the workspace is smaller than the alphas and betas";
  }
  return lengths_error(logit_lengths, label_lengths, B, T, U1 - 1);
}

ffi::Error from_core(const Status& s) {
  if (s.ok()) return ffi::Error::Success();
  const std::string message = std::string("tdt_lattice_loss: ") + s.message;
  if (s.code == StatusCode::kInvalidArgument) return ffi::Error::InvalidArgument(message);
  return ffi::Error::Internal(message);
}

ffi::Error tdt_host(ffi::Buffer<ffi::F32> lattice, ffi::Buffer<ffi::S32> logit_lengths,
                    ffi::Buffer<ffi::S32> label_lengths, ffi::ResultBuffer<ffi::F32> costs,
                    ffi::ResultBuffer<ffi::F32> grads, ffi::Result<ffi::AnyBuffer> workspace,
                    ffi::Span<const int64_t> durations, float fastemit_lambda, float clamp,
                    ffi::ThreadPool pool) {
  const auto d = lattice.dimensions();
  const int64_t B = d[0], T = d[1], U1 = d[2];
  TdtLossOptions options;
  const std::string error =
      prepare(durations, fastemit_lambda, clamp, logit_lengths.typed_data(),
              label_lengths.typed_data(), B, T, U1, workspace->size_bytes(), &options);
  if (!error.empty()) return ffi::Error::InvalidArgument(error);
  if (B == 0) return ffi::Error::Success();
  float* alphas = static_cast<float*>(workspace->untyped_data());
  return from_core(tdt_lattice_loss_cpu(lattice.typed_data(), logit_lengths.typed_data(),
                                        label_lengths.typed_data(), B, T, U1, options,
                                        costs->typed_data(), grads->typed_data(), alphas,
                                        alphas + B * T * U1, pool_parallel_for(&pool)));
}

// The buffers and attributes of both handlers (the platform's context aside).
#define TF_RNNT_TDT_FFI_BINDING                    \
  Arg<ffi::Buffer<ffi::F32>>()                     \
      .Arg<ffi::Buffer<ffi::S32>>()                \
      .Arg<ffi::Buffer<ffi::S32>>()                \
      .Ret<ffi::Buffer<ffi::F32>>()                \
      .Ret<ffi::Buffer<ffi::F32>>()                \
      .Ret<ffi::AnyBuffer>()                       \
      .Attr<ffi::Span<const int64_t>>("durations") \
      .Attr<float>("fastemit_lambda")              \
      .Attr<float>("clamp")

XLA_FFI_DEFINE_HANDLER(kTdtHost, tdt_host,
                       ffi::Ffi::Bind().TF_RNNT_TDT_FFI_BINDING.Ctx<ffi::ThreadPool>());

#if TF_RNNT_WITH_CUDA
ffi::Error tdt_cuda(cudaStream_t stream, ffi::Buffer<ffi::F32> lattice,
                    ffi::Buffer<ffi::S32> logit_lengths, ffi::Buffer<ffi::S32> label_lengths,
                    ffi::ResultBuffer<ffi::F32> costs, ffi::ResultBuffer<ffi::F32> grads,
                    ffi::Result<ffi::AnyBuffer> workspace, ffi::Span<const int64_t> durations,
                    float fastemit_lambda, float clamp) {
  const auto d = lattice.dimensions();
  const int64_t B = d[0], T = d[1], U1 = d[2];
  std::vector<int32_t> host(2 * B);
  if (B > 0) {
    for (int i = 0; i < 2; ++i) {
      const int32_t* src = i == 0 ? logit_lengths.typed_data() : label_lengths.typed_data();
      const cudaError_t e = cudaMemcpyAsync(host.data() + i * B, src, B * sizeof(int32_t),
                                            cudaMemcpyDeviceToHost, stream);
      if (e != cudaSuccess) {
        return ffi::Error::Internal(std::string("tdt_lattice_loss: ") + cudaGetErrorName(e));
      }
    }
    const cudaError_t e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) {
      return ffi::Error::Internal(std::string("tdt_lattice_loss: ") + cudaGetErrorName(e));
    }
  }
  TdtLossOptions options;
  const std::string error = prepare(durations, fastemit_lambda, clamp, host.data(), host.data() + B,
                                    B, T, U1, workspace->size_bytes(), &options);
  if (!error.empty()) return ffi::Error::InvalidArgument(error);
  if (B == 0) return ffi::Error::Success();
  float* alphas = static_cast<float*>(workspace->untyped_data());
  return from_core(tdt_lattice_loss_cuda(
      lattice.typed_data(), logit_lengths.typed_data(), label_lengths.typed_data(), B, T, U1,
      options, costs->typed_data(), grads->typed_data(), alphas, alphas + B * T * U1, stream));
}

XLA_FFI_DEFINE_HANDLER(
    kTdtCuda, tdt_cuda,
    ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>().TF_RNNT_TDT_FFI_BINDING);
#endif  // TF_RNNT_WITH_CUDA

// ------------------------------------------------------------------ registration
const bool kHandlersRegistered = [] {
  const XLA_FFI_Api* api = XLA_FFI_GetApi();
  register_handler(api, kTarget, "Host", kTdtHost);
#if TF_RNNT_WITH_CUDA
  register_handler(api, kTarget, "CUDA", kTdtCuda);
#endif
  return true;
}();

}  // namespace
}  // namespace tf_rnnt
