// CPU-only builds: the CUDA launchers exist but report that CUDA was not compiled in. The GPU
// kernels are not registered in such a build, so TensorFlow never calls these.
#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {

namespace {
Status unavailable() {
  Status s;
  s.code = StatusCode::kCudaError;
  s.message = "tf_rnnt was built without CUDA";
  return s;
}
}  // namespace

Status lattice_loss_cuda(const float*, const int32_t*, const int32_t*, int, int, int,
                         const LatticeLossOptions&, float*, float*, float*, float*, GpuStream) {
  return unavailable();
}
Status logits_to_lattice_cuda(const void*, DType, const int32_t*, int, int, int, int, int, float*,
                              float*, GpuStream) {
  return unavailable();
}
Status logits_to_lattice_grad_cuda(const void*, DType, const int32_t*, int, int, int, int, int,
                                   const float*, const float*, void*, GpuStream) {
  return unavailable();
}
size_t joint_workspace_bytes_cuda(const JointShape&, const JointOptions&, int64_t, bool, bool) {
  return 0;
}
JointSavedSizes joint_saved_sizes_cuda(const JointShape&, const JointOptions&, int64_t) {
  return JointSavedSizes();
}
Status joint_forward_cuda(const JointShape&, const JointOptions&, const JointForwardArgs&,
                          GpuStream) {
  return unavailable();
}
Status joint_backward_cuda(const JointShape&, const JointOptions&, const JointBackwardArgs&,
                           GpuStream) {
  return unavailable();
}
Status copy_cuda(void*, const void*, size_t, GpuStream) { return unavailable(); }
Status upload_cuda(void*, const void*, size_t, GpuStream) { return unavailable(); }

}  // namespace tf_rnnt
