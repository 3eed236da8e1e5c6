// Input positions of the ops, shared by their registrations (ops.cc) and kernels (kernels.cc).
// Each enum lists the op's inputs in REGISTER_OP order. The *_host inputs repeat an input in host
// memory (HostMemory in the GPU kernels), so kernels validate and plan without device reads. The
// joint ops' GPU kernels take their other int32 inputs in host memory too, and upload them.
#ifndef TF_RNNT_TF_OP_INPUTS_H_
#define TF_RNNT_TF_OP_INPUTS_H_

namespace tf_rnnt {

// TfRnntLatticeLoss
namespace lattice_loss_in {
enum : int { kLattice, kLogitLengths, kLabelLengths, kLogitLengthsHost, kLabelLengthsHost };
}  // namespace lattice_loss_in

// TfRnntLogitsToLattice
namespace logits_to_lattice_in {
enum : int { kLogits, kLabels, kLabelsHost, kLabelLengthsHost };
}  // namespace logits_to_lattice_in

// TfRnntLogitsToLatticeGrad
namespace logits_to_lattice_grad_in {
enum : int { kLogits, kLabels, kLse, kDLattice };
}  // namespace logits_to_lattice_grad_in

// TfRnntJointLattice and TfRnntJointLatticeGrad: the first seven inputs are shared.
namespace joint_in {
enum : int {
  kEncoder,
  kPredictor,
  kKernel,
  kBias,
  kLabels,
  kLogitLengths,
  kLabelLengths,
  // TfRnntJointLattice
  kLabelsHost = 7,
  kLogitLengthsHost = 8,
  kLabelLengthsHost = 9,
};
}  // namespace joint_in

namespace joint_grad_in {
enum : int {
  // kEncoder .. kLabelLengths as joint_in
  kLogitLengthsHost = 7,
  kLabelLengthsHost = 8,
  kLse = 9,
  kDLattice = 10,
  kSavedHidden = 11,
  kSavedLogits = 12,
};
}  // namespace joint_grad_in

}  // namespace tf_rnnt

#endif  // TF_RNNT_TF_OP_INPUTS_H_
