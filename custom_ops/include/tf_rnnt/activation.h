// The joint network's activation, shared by the launchers' options and the per-node math.
#ifndef TF_RNNT_ACTIVATION_H_
#define TF_RNNT_ACTIVATION_H_

namespace tf_rnnt {

enum class Activation : int { kTanh = 0, kRelu = 1, kIdentity = 2 };

}  // namespace tf_rnnt

#endif  // TF_RNNT_ACTIVATION_H_
