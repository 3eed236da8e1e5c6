// CPU TDT loss on a lattice (tdt_core.h): one sample per task, nodes in row-major order.
#include <cmath>
#include <cstring>

#include "tf_rnnt/tdt_core.h"

namespace tf_rnnt {

namespace {

void tdt_sample(const float* lat, int T, int U1, int T_b, int U_b, const TdtLossOptions& options,
                float* cost, float* grad, float* alpha, float* beta) {
  const int C = 2 + options.num_durations;
  auto at = [U1](int t, int u) { return static_cast<int64_t>(t) * U1 + u; };
  // alpha(t, u) reads rows t - d and, for d = 0, node (t, u - 1): rows ascending, u ascending.
  for (int t = 0; t < T_b; ++t) {
    for (int u = 0; u <= U_b; ++u) {
      alpha[at(t, u)] = t == 0 && u == 0 ? 0.f : tdt_alpha(lat, alpha, t, u, U1, options);
    }
  }
  for (int t = T_b - 1; t >= 0; --t) {
    for (int u = U_b; u >= 0; --u) {
      beta[at(t, u)] = tdt_beta(lat, beta, t, u, T_b, U_b, U1, options);
    }
  }
  const float log_prob = beta[0];
  *cost = -log_prob;
  std::memset(grad, 0, sizeof(float) * C * T * U1);
  // A sample with no alignment (or non-finite inputs) keeps a zero gradient.
  if (!std::isfinite(log_prob)) return;
  for (int t = 0; t < T_b; ++t) {
    for (int u = 0; u <= U_b; ++u) {
      tdt_node_grad(lat, alpha, beta, t, u, T_b, U_b, U1, log_prob, options, grad + C * at(t, u));
    }
  }
}

}  // namespace

const char* tdt_options_error(const TdtLossOptions& options) {
  const int D = options.num_durations;
  if (D < 1 || D > kTdtMaxDurations) return "durations must hold 1 to 64 values";
  bool has_one = false;
  for (int i = 0; i < D; ++i) {
    if (options.durations[i] < 0) return "durations must be non-negative";
    if (i > 0 && options.durations[i] <= options.durations[i - 1]) {
      return "durations must be strictly increasing";
    }
    has_one |= options.durations[i] == 1;
  }
  return has_one ? nullptr : "durations must contain 1";
}

Status tdt_lattice_loss_cpu(const float* lattice, const int32_t* logit_lengths,
                            const int32_t* label_lengths, int B, int T, int U1,
                            const TdtLossOptions& options, float* costs, float* grads,
                            float* alphas, float* betas, const ParallelFor& parallel_for) {
  if (const char* error = tdt_options_error(options)) {
    Status s;
    s.code = StatusCode::kInvalidArgument;
    s.message = error;
    return s;
  }
  const int C = 2 + options.num_durations;
  const int64_t per_sample = static_cast<int64_t>(T) * U1;
  parallel_for(B, per_sample * 100 * C, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      tdt_sample(lattice + C * b * per_sample, T, U1, logit_lengths[b], label_lengths[b], options,
                 costs + b, grads + C * b * per_sample, alphas + b * per_sample,
                 betas + b * per_sample);
    }
  });
  return Status();
}

}  // namespace tf_rnnt
