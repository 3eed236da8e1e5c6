// Op registrations and shape functions. Lengths and labels are also passed as host copies
// (HostMemory in the GPU kernels) so the kernels can validate them and plan tiles without
// reading device memory back.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

#include "op_inputs.h"
#include "shape_fns.h"

namespace tf_rnnt {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("TfRnntLatticeLoss")
    .Input("lattice: float")
    .Input("logit_lengths: int32")
    .Input("label_lengths: int32")
    .Input("logit_lengths_host: int32")
    .Input("label_lengths_host: int32")
    .Attr("fastemit_lambda: float = 0.0")
    .Attr("clamp: float = -1.0")
    .Attr("validate_lengths: bool = true")
    .Output("costs: float")
    .Output("grads: float")
    .SetShapeFn([](InferenceContext* c) {
      using namespace lattice_loss_in;  // NOLINT: the input names
      bool validate = true;
      TF_RETURN_IF_ERROR(c->GetAttr("validate_lengths", &validate));
      DimensionHandle batch;
      if (validate) {
        TF_RETURN_IF_ERROR(batch_dim(
            c, kLattice, 4, {kLogitLengths, kLabelLengths, kLogitLengthsHost, kLabelLengthsHost},
            &batch));
      } else {
        TF_RETURN_IF_ERROR(batch_dim(c, kLattice, 4, {kLogitLengths, kLabelLengths}, &batch));
      }
      ShapeHandle lattice;
      DimensionHandle two;
      TF_RETURN_IF_ERROR(c->WithValue(c->Dim(c->input(kLattice), 3), 2, &two));
      TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(kLattice), 0, batch, &lattice));
      c->set_output(0, c->Vector(batch));
      c->set_output(1, lattice);
      return Status();
    })
    .Doc(R"doc(RNN-T costs of a [B, T, U+1, 2] log-probability lattice and d cost / d lattice.

validate_lengths: when false the caller guarantees logit lengths in [0, T] and label lengths in
  [0, U]; the *_host inputs are then ignored (pass empty [0] tensors) and the kernels read the
  lengths from the device inputs only, so no host copy is needed. A sample with 0 frames gets
  an undefined cost (and a zero gradient) that the caller must reject.
)doc");

REGISTER_OP("TfRnntLogitsToLattice")
    .Input("logits: dtype")
    .Input("labels: int32")
    .Input("labels_host: int32")
    .Input("label_lengths_host: int32")
    .Attr("dtype: {float, half, bfloat16}")
    .Attr("blank: int")
    .Attr("validate_labels: bool")
    .Output("lattice: float")
    .Output("lse: float")
    .SetShapeFn([](InferenceContext* c) {
      using namespace logits_to_lattice_in;  // NOLINT: the input names
      ShapeHandle logits, labels;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(kLogits), 4, &logits));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(kLabels), 2, &labels));
      DimensionHandle batch;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(logits, 0), c->Dim(labels, 0), &batch));
      DimensionHandle u1;
      TF_RETURN_IF_ERROR(c->Add(c->Dim(labels, 1), 1, &u1));
      TF_RETURN_IF_ERROR(c->Merge(u1, c->Dim(logits, 2), &u1));
      c->set_output(0, c->MakeShape({batch, c->Dim(logits, 1), u1, c->MakeDim(2)}));
      c->set_output(1, c->MakeShape({batch, c->Dim(logits, 1), u1}));
      return Status();
    })
    .Doc("log_softmax(logits) at blank and at the next label, and the log-sum-exp.");

REGISTER_OP("TfRnntLogitsToLatticeGrad")
    .Input("logits: dtype")
    .Input("labels: int32")
    .Input("lse: float")
    .Input("d_lattice: float")
    .Attr("dtype: {float, half, bfloat16}")
    .Attr("blank: int")
    .Output("d_logits: dtype")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(logits_to_lattice_grad_in::kLogits));
      return Status();
    });

// The inputs both joint ops start with (joint_in in op_inputs.h).
#define TF_RNNT_JOINT_INPUTS         \
  Input("encoder: dtype")            \
      .Input("predictor: dtype")     \
      .Input("kernel: dtype")        \
      .Input("bias: dtype")          \
      .Input("labels: int32")        \
      .Input("logit_lengths: int32") \
      .Input("label_lengths: int32")

#define TF_RNNT_JOINT_ATTRS                                     \
  Attr("dtype: {float, half, bfloat16}")                        \
      .Attr("blank: int")                                       \
      .Attr("activation: {'tanh', 'relu', 'identity'}")         \
      .Attr("untiled: bool = false")                            \
      .Attr("tile_nodes: int = 0")                              \
      .Attr("memory_budget: int = 0")                           \
      .Attr("allow_tf32: bool = true")                          \
      .Attr("gpu_kernel: {'auto', 'fused', 'cublas'} = 'auto'") \
      .Attr("num_durations: int >= 0 = 0")

REGISTER_OP("TfRnntJointLattice")
    .TF_RNNT_JOINT_INPUTS
    .Input("labels_host: int32")
    .Input("logit_lengths_host: int32")
    .Input("label_lengths_host: int32")
    .TF_RNNT_JOINT_ATTRS
    .Output("lattice: float")
    .Output("lse: float")
    .Output("saved_hidden: dtype")
    .Output("saved_logits: float")
    .SetShapeFn([](InferenceContext* c) {
      using namespace joint_in;  // NOLINT: the input names
      ShapeHandle enc, pred, kernel, bias, labels;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(kEncoder), 3, &enc));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(kPredictor), 3, &pred));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(kKernel), 2, &kernel));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(kBias), 1, &bias));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(kLabels), 2, &labels));
      DimensionHandle batch, hidden, vocab, u1;
      TF_RETURN_IF_ERROR(batch_dim(c, kEncoder, 3, {kLogitLengths, kLabelLengths}, &batch));
      TF_RETURN_IF_ERROR(c->Merge(batch, c->Dim(pred, 0), &batch));
      TF_RETURN_IF_ERROR(c->Merge(batch, c->Dim(labels, 0), &batch));
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(enc, 2), c->Dim(pred, 2), &hidden));
      TF_RETURN_IF_ERROR(c->Merge(hidden, c->Dim(kernel, 0), &hidden));
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(kernel, 1), c->Dim(bias, 0), &vocab));
      TF_RETURN_IF_ERROR(c->Add(c->Dim(labels, 1), 1, &u1));
      TF_RETURN_IF_ERROR(c->Merge(u1, c->Dim(pred, 1), &u1));
      int64_t num_durations = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_durations", &num_durations));
      c->set_output(0, c->MakeShape({batch, c->Dim(enc, 1), u1, c->MakeDim(2 + num_durations)}));
      // lse [N] of the N valid nodes; saved_hidden / saved_logits: what untiled mode keeps for
      // the gradient, in a layout of the device's choosing (empty in tiled mode).
      for (int i = 1; i < 4; ++i) c->set_output(i, c->Vector(c->UnknownDim()));
      return Status();
    })
    .Doc(R"doc(Fused joint + output layer + log-softmax picks, tile by tile (Flash RNN-T).

num_durations: D > 0 makes a TDT joint: the last D of the kernel's columns are duration logits
  with their own log-softmax, and the lattice has 2 + D channels (rnnt_core.h, JointShape).

gpu_kernel: the GPU kernels of the joint: "fused" (Hopper's fused tile kernels; an error where
  they do not apply), "cublas" (element-wise kernels around cuBLAS GEMMs) or "auto" (fused where
  they apply). The CPU kernels ignore it. The gradient op takes the forward op's value.
)doc");

REGISTER_OP("TfRnntJointLatticeGrad")
    .TF_RNNT_JOINT_INPUTS
    .Input("logit_lengths_host: int32")
    .Input("label_lengths_host: int32")
    .Input("lse: float")
    .Input("d_lattice: float")
    .Input("saved_hidden: dtype")
    .Input("saved_logits: float")
    .TF_RNNT_JOINT_ATTRS
    .Output("d_encoder: dtype")
    .Output("d_predictor: dtype")
    .Output("d_kernel: dtype")
    .Output("d_bias: dtype")
    .SetShapeFn([](InferenceContext* c) {
      // d encoder, d predictor, d kernel, d bias: shaped as the first four inputs.
      for (int i = joint_in::kEncoder; i <= joint_in::kBias; ++i) c->set_output(i, c->input(i));
      return Status();
    });

}  // namespace tf_rnnt
