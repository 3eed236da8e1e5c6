// TfRnntCheck: `checked = value` once every entry of `ok` is true, else InvalidArgument(message
// followed by the entries of `data`, an int32 tensor of details such as the offending ids).
// The Python layer threads a small tensor that feeds the computation through it (e.g. the label
// lengths), so the check is part of the data flow: XLA keeps it, where it prunes tf.debugging
// assertions (check_xla.cc lowers it to a custom call that fails the same way).
#include <string>

#include "check_message.h"

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_rnnt {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;

class CheckOp : public OpKernel {
 public:
  explicit CheckOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("message", &message_));
  }

  void Compute(OpKernelContext* ctx) override {
    const auto ok = ctx->input(1).flat<bool>();
    const auto data = ctx->input(2).flat<int32_t>();
    for (int64_t i = 0; i < ok.size(); ++i) {
      OP_REQUIRES(ctx, ok(i),
                  ::tensorflow::errors::InvalidArgument(
                      check_message(message_, data.data(), static_cast<size_t>(data.size()))));
    }
    ctx->set_output(0, ctx->input(0));
  }

 private:
  std::string message_;
};

}  // namespace

REGISTER_OP("TfRnntCheck")
    .Input("value: T")
    .Input("ok: bool")
    .Input("data: int32")
    .Output("checked: T")
    .Attr("T: {int32, float}")
    .Attr("message: string")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return ::tensorflow::Status();
    });

REGISTER_KERNEL_BUILDER(Name("TfRnntCheck").Device(::tensorflow::DEVICE_CPU), CheckOp);

#if TF_RNNT_WITH_CUDA
// `ok` is read on the host; int32 values stay there too (TensorFlow's convention for small int32
// tensors), float ones pass through in device memory.
REGISTER_KERNEL_BUILDER(Name("TfRnntCheck")
                            .Device(::tensorflow::DEVICE_GPU)
                            .TypeConstraint<int32_t>("T")
                            .HostMemory("value")
                            .HostMemory("ok")
                            .HostMemory("data")
                            .HostMemory("checked"),
                        CheckOp);
REGISTER_KERNEL_BUILDER(Name("TfRnntCheck")
                            .Device(::tensorflow::DEVICE_GPU)
                            .TypeConstraint<float>("T")
                            .HostMemory("ok")
                            .HostMemory("data"),
                        CheckOp);
#endif

}  // namespace tf_rnnt
