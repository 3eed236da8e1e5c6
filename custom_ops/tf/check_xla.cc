// XLA lowering of TfRnntCheck (check_op.cc): a typed-FFI custom call that copies `value` to its
// result and returns InvalidArgument(message) unless every entry of `ok` is true. On the GPU `ok`
// is copied to the host on the call's stream (it is small).
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "check_message.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"
#include "xla/hlo/builder/xla_builder.h"
#include "xla/shape_util.h"
#include "xla_shared.h"

namespace tf_rnnt {
namespace {

namespace ffi = ::xla::ffi;

// An MLIR string literal: every byte outside [A-Za-z0-9 ] as a \XX hex escape.
std::string mlir_string(const std::string& s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out = "\"";
  for (unsigned char c : s) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == ' ') {
      out += static_cast<char>(c);
    } else {
      out += '\\';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out + "\"";
}

class CheckXla : public ::tensorflow::XlaOpKernel {
 public:
  explicit CheckXla(::tensorflow::OpKernelConstruction* ctx) : XlaOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("message", &message_));
  }

  void Compile(::tensorflow::XlaOpKernelContext* ctx) override {
    auto shape = ctx->InputXlaShape(0);
    OP_REQUIRES_OK(ctx, shape.status());
    const ::xla::XlaOp call = ::xla::CustomCall(
        ctx->builder(), "tf_rnnt_check", {ctx->Input(0), ctx->Input(1), ctx->Input(2)}, *shape,
        "{message = " + mlir_string(message_) + "}", /*has_side_effect=*/false,
        /*output_operand_aliasing=*/{}, /*literal=*/nullptr,
        ::xla::CustomCallSchedule::SCHEDULE_NONE,
        ::xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
    ctx->SetOutput(0, call);
  }

 private:
  std::string message_;
};

REGISTER_KERNEL_BUILDER(Name("TfRnntCheck").Device(::tensorflow::DEVICE_CPU_XLA_JIT), CheckXla);
#if TF_RNNT_WITH_CUDA
REGISTER_KERNEL_BUILDER(Name("TfRnntCheck").Device(::tensorflow::DEVICE_GPU_XLA_JIT), CheckXla);
#endif

ffi::Error check_host(ffi::AnyBuffer value, ffi::Buffer<ffi::PRED> ok, ffi::Buffer<ffi::S32> data,
                      ffi::Result<ffi::AnyBuffer> checked, std::string_view message) {
  for (size_t i = 0; i < ok.element_count(); ++i) {
    if (!ok.typed_data()[i]) {
      return ffi::Error::InvalidArgument(
          check_message(std::string(message), data.typed_data(), data.element_count()));
    }
  }
  if (value.size_bytes() > 0 && checked->untyped_data() != value.untyped_data()) {
    std::memcpy(checked->untyped_data(), value.untyped_data(), value.size_bytes());
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER(kCheckHost, check_host,
                       ffi::Ffi::Bind()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::Buffer<ffi::PRED>>()
                           .Arg<ffi::Buffer<ffi::S32>>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<std::string_view>("message"));

#if TF_RNNT_WITH_CUDA
ffi::Error cuda_failure(cudaError_t e) {
  return ffi::Error::Internal(std::string("tf_rnnt check: ") + cudaGetErrorName(e));
}

ffi::Error check_cuda(cudaStream_t stream, ffi::AnyBuffer value, ffi::Buffer<ffi::PRED> ok,
                      ffi::Buffer<ffi::S32> data, ffi::Result<ffi::AnyBuffer> checked,
                      std::string_view message) {
  std::vector<char> host_ok(ok.element_count());
  std::vector<int32_t> host_data(data.element_count());
  cudaError_t e = cudaSuccess;
  if (!host_ok.empty()) {
    e = cudaMemcpyAsync(host_ok.data(), ok.typed_data(), host_ok.size() * sizeof(bool),
                        cudaMemcpyDeviceToHost, stream);
  }
  if (e == cudaSuccess && !host_data.empty()) {
    e = cudaMemcpyAsync(host_data.data(), data.typed_data(), host_data.size() * sizeof(int32_t),
                        cudaMemcpyDeviceToHost, stream);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return cuda_failure(e);
  for (char v : host_ok) {
    if (!v) {
      return ffi::Error::InvalidArgument(
          check_message(std::string(message), host_data.data(), host_data.size()));
    }
  }
  if (value.size_bytes() > 0 && checked->untyped_data() != value.untyped_data()) {
    e = cudaMemcpyAsync(checked->untyped_data(), value.untyped_data(), value.size_bytes(),
                        cudaMemcpyDeviceToDevice, stream);
    if (e != cudaSuccess) return cuda_failure(e);
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER(kCheckCuda, check_cuda,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<cudaStream_t>>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::Buffer<ffi::PRED>>()
                           .Arg<ffi::Buffer<ffi::S32>>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<std::string_view>("message"));
#endif

const bool kCheckRegistered = [] {
  const XLA_FFI_Api* api = XLA_FFI_GetApi();
  register_handler(api, "tf_rnnt_check", "Host", kCheckHost);
#if TF_RNNT_WITH_CUDA
  register_handler(api, "tf_rnnt_check", "CUDA", kCheckCuda);
#endif
  return true;
}();

}  // namespace
}  // namespace tf_rnnt
