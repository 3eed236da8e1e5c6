// The fused joint's four gradients as float32 accumulators, shared by the CPU and CUDA launchers:
// float32 inputs accumulate in the outputs themselves, 16-bit inputs in workspace buffers that
// the launcher casts to the outputs at the end.
#ifndef TF_RNNT_JOINT_GRADS_H_
#define TF_RNNT_JOINT_GRADS_H_

#include <cstdint>

#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {

// Elements of d encoder, d predictor, d kernel and d bias.
struct GradSizes {
  int64_t encoder, predictor, kernel, bias;
  explicit GradSizes(const JointShape& s)
      : encoder(static_cast<int64_t>(s.B) * s.T * s.H),
        predictor(static_cast<int64_t>(s.B) * s.U1 * s.H),
        kernel(static_cast<int64_t>(s.H) * s.V),
        bias(s.V) {}
};

struct GradAccumulators {
  float* d_encoder = nullptr;    // [B, T, H]
  float* d_predictor = nullptr;  // [B, U1, H]
  float* d_kernel = nullptr;     // [H, V]
  float* d_bias = nullptr;       // [V]

  // The outputs themselves (float32 inputs).
  static GradAccumulators of_outputs(const JointBackwardArgs& a) {
    GradAccumulators acc;
    acc.d_encoder = static_cast<float*>(a.d_encoder);
    acc.d_predictor = static_cast<float*>(a.d_predictor);
    acc.d_kernel = static_cast<float*>(a.d_kernel);
    acc.d_bias = static_cast<float*>(a.d_bias);
    return acc;
  }
};

}  // namespace tf_rnnt

#endif  // TF_RNNT_JOINT_GRADS_H_
