// Framework-free launchers of the TDT (Token-and-Duration Transducer, Xu et al. 2023) lattice
// loss, and its per-node math written once for the CPU and CUDA paths.
//
// Layout (row-major): lattice [B, T, U1, C] float32 with C = 2 + D channels per node:
//   0: log P(blank | t, u) - sigma, 1: log P(y_{u+1} | t, u) - sigma,
//   2 + i: log P(durations[i] | t, u).
// Moves (NeMo's convention): from (t, u) a blank with duration d >= 1 goes to (t + d, u), label
// y_{u+1} with duration d >= 0 to (t + d, u + 1), each scoring its token channel plus its
// duration channel. Intermediate nodes lie at t < T_b; the last emission is a blank landing on
// t + d == T_b at u == U_b. With d_i = durations[i] and dur_i its channel:
//   alpha(0, 0) = 0; alpha(t, u) = logsumexp over i of
//     alpha(t - d_i, u) + blank + dur_i (d_i >= 1) and alpha(t - d_i, u - 1) + label + dur_i,
//     the channels read at the node the move starts from;
//   beta(t, u) = logsumexp over i of
//     beta(t + d_i, u) + blank + dur_i (d_i >= 1, t + d_i < T_b),
//     blank + dur_i (d_i >= 1, t + d_i == T_b, u == U_b) and
//     beta(t + d_i, u + 1) + label + dur_i (u < U_b, t + d_i < T_b);
//   log P(y|x) = beta(0, 0).
// d cost / d lattice is minus the posterior of the moves each channel scores: blank (all
// durations), label (all durations), duration i (blank and label moves of duration d_i).
#ifndef TF_RNNT_TDT_CORE_H_
#define TF_RNNT_TDT_CORE_H_

#include <cstdint>

#include "tf_rnnt/node_math.h"
#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {

// Most durations a TDT lattice takes (tf_rnnt._contract.MAX_TDT_DURATIONS): they travel by value
// in the options, so the CUDA kernels get them as a kernel argument.
constexpr int kTdtMaxDurations = 64;

struct TdtLossOptions {
  int num_durations = 0;                 // D
  int durations[kTdtMaxDurations] = {};  // strictly increasing, >= 0, containing 1
  float fastemit_lambda = 0.f;           // the label channel's gradient is scaled by 1 + lambda
  float clamp = -1.f;                    // every channel's gradient clipped to [-clamp, clamp]
};

// The first problem with the options, or nullptr: D in [1, kTdtMaxDurations], durations
// non-negative, strictly increasing and containing 1.
const char* tdt_options_error(const TdtLossOptions& options);

// costs [B] (+inf for a sample without an alignment); grads [B, T, U1, C] = d cost_b / d lattice
// (0 outside each sample's rectangle, and everywhere for a sample whose cost is not finite);
// alphas, betas: workspaces of B * T * U1 floats. Lengths are host pointers, logit lengths in
// [1, T], label lengths in [0, U1 - 1].
Status tdt_lattice_loss_cpu(const float* lattice, const int32_t* logit_lengths,
                            const int32_t* label_lengths, int B, int T, int U1,
                            const TdtLossOptions& options, float* costs, float* grads,
                            float* alphas, float* betas, const ParallelFor& parallel_for);

// The same on the GPU; lengths are device pointers.
Status tdt_lattice_loss_cuda(const float* lattice, const int32_t* logit_lengths,
                             const int32_t* label_lengths, int B, int T, int U1,
                             const TdtLossOptions& options, float* costs, float* grads,
                             float* alphas, float* betas, GpuStream stream);

// ---------------------------------------------------------------- per-node math
// All take one sample's lattice, alphas or betas ([T, U1, C] and [T, U1]) and node (t, u).

// alpha(t, u) for (t, u) != (0, 0) from the alphas of earlier nodes.
TF_RNNT_HD float tdt_alpha(const float* lat, const float* alpha, int t, int u, int U1,
                           const TdtLossOptions& o) {
  const int C = 2 + o.num_durations;
  float a = kNegInf;
  for (int i = 0; i < o.num_durations; ++i) {
    const int d = o.durations[i];
    if (d > t) break;  // ascending durations
    const int64_t from = static_cast<int64_t>(t - d) * U1 + u;
    if (d >= 1) a = log_add(a, alpha[from] + lat[from * C] + lat[from * C + 2 + i]);
    if (u >= 1) {
      a = log_add(a, alpha[from - 1] + lat[(from - 1) * C + 1] + lat[(from - 1) * C + 2 + i]);
    }
  }
  return a;
}

// beta(t, u) from the betas of later nodes, for a sample of T_b frames and U_b labels.
TF_RNNT_HD float tdt_beta(const float* lat, const float* beta, int t, int u, int T_b, int U_b,
                          int U1, const TdtLossOptions& o) {
  const int C = 2 + o.num_durations;
  const int64_t node = static_cast<int64_t>(t) * U1 + u;
  const float blank = lat[node * C], label = lat[node * C + 1];
  float b = kNegInf;
  for (int i = 0; i < o.num_durations; ++i) {
    const int d = o.durations[i];
    if (t + d > T_b) break;
    const float dur = lat[node * C + 2 + i];
    if (t + d < T_b) {
      const int64_t to = node + static_cast<int64_t>(d) * U1;
      if (d >= 1) b = log_add(b, beta[to] + blank + dur);
      if (u < U_b) b = log_add(b, beta[to + 1] + label + dur);
    } else if (d >= 1 && u == U_b) {
      b = log_add(b, blank + dur);
    }
  }
  return b;
}

TF_RNNT_HD float tdt_clamped(float g, float clamp) {
  return clamp > 0.f ? fminf(fmaxf(g, -clamp), clamp) : g;
}

// d cost / d lattice at node (t, u): the C channels into grad[0 .. C).
TF_RNNT_HD void tdt_node_grad(const float* lat, const float* alpha, const float* beta, int t, int u,
                              int T_b, int U_b, int U1, float log_prob, const TdtLossOptions& o,
                              float* grad) {
  const int C = 2 + o.num_durations;
  const int64_t node = static_cast<int64_t>(t) * U1 + u;
  const float a = alpha[node], blank = lat[node * C], label = lat[node * C + 1];
  float g_blank = 0.f, g_label = 0.f;
  for (int i = 0; i < o.num_durations; ++i) {
    const int d = o.durations[i];
    const float dur = lat[node * C + 2 + i];
    float p_blank = 0.f, p_label = 0.f;
    if (t + d < T_b) {
      const int64_t to = node + static_cast<int64_t>(d) * U1;
      if (d >= 1) p_blank = expf(a + blank + dur + beta[to] - log_prob);
      if (u < U_b) p_label = expf(a + label + dur + beta[to + 1] - log_prob);
    } else if (t + d == T_b && d >= 1 && u == U_b) {
      p_blank = expf(a + blank + dur - log_prob);
    }
    g_blank -= p_blank;
    g_label -= p_label;
    grad[2 + i] = tdt_clamped(0.f - (p_blank + p_label), o.clamp);
  }
  grad[0] = tdt_clamped(g_blank, o.clamp);
  grad[1] = tdt_clamped((1.f + o.fastemit_lambda) * g_label, o.clamp);
}

}  // namespace tf_rnnt

#endif  // TF_RNNT_TDT_CORE_H_
