// The core launchers behind one host-memory interface, so core_test.cc runs the same cases on the
// CPU and on the GPU (core_test_gpu.cu copies to the device, launches and copies back).
#ifndef TF_RNNT_CORE_TEST_H_
#define TF_RNNT_CORE_TEST_H_

#include <string>
#include <vector>

#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {
namespace test {

// A fused joint problem in host memory (float values; options.dtype says what the launchers get).
struct JointCase {
  JointShape shape;
  JointOptions options;
  std::vector<float> encoder, predictor, kernel, bias;
  std::vector<int32_t> labels, logit_lengths, label_lengths;
};

struct JointResult {
  std::vector<float> lattice, lse;                              // forward
  std::vector<float> d_encoder, d_predictor, d_kernel, d_bias;  // backward, given d_lattice
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual Status lattice_loss(const std::vector<float>& lattice,
                              const std::vector<int32_t>& logit_lengths,
                              const std::vector<int32_t>& label_lengths, int B, int T, int U1,
                              const LatticeLossOptions& options, std::vector<float>* costs,
                              std::vector<float>* grads) = 0;
  virtual Status logits_to_lattice(const std::vector<float>& logits,
                                   const std::vector<int32_t>& labels, int B, int T, int U1, int V,
                                   int blank, std::vector<float>* lattice,
                                   std::vector<float>* lse) = 0;
  virtual Status logits_to_lattice_grad(const std::vector<float>& logits,
                                        const std::vector<int32_t>& labels, int B, int T, int U1,
                                        int V, int blank, const std::vector<float>& lse,
                                        const std::vector<float>& d_lattice,
                                        std::vector<float>* d_logits) = 0;
  // Forward, then backward with d_lattice; tile_nodes <= 0 runs untiled mode. The case's values
  // are rounded to options.dtype on the way in (a backend may take float32 only).
  virtual Status joint(const JointCase& c, int64_t tile_nodes, const std::vector<float>& d_lattice,
                       JointResult* result) = 0;
  // Why the fused tile kernels cannot run the case here (null: they can).
  virtual const char* fused_unavailable(const JointCase&) { return "not a CUDA backend"; }
  // upload_cuda of each source in turn on one stream, behind queued work, with the host copy
  // overwritten as soon as each call returns; then the device copies read back. GPU only.
  virtual Status upload(const std::vector<std::vector<int32_t>>& sources,
                        std::vector<std::vector<int32_t>>* device_copies) {
    Status s;
    s.code = StatusCode::kInvalidArgument;
    s.message = "not a CUDA backend";
    return s;
  }
};

Backend* cpu_backend();
// The GPU backend, or null with *why set (no CUDA in this build, no device, no cuBLAS).
Backend* gpu_backend(std::string* why);

}  // namespace test
}  // namespace tf_rnnt

#endif  // TF_RNNT_CORE_TEST_H_
