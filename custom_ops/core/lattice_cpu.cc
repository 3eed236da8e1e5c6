// CPU RNN-T loss on a lattice and the logits -> lattice reduction.
#include <algorithm>
#include <cstring>

#include "tf_rnnt/dtype_cpu.h"
#include "tf_rnnt/node_math.h"
#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {

namespace {

// One sample: alphas (eq. 16), betas (eq. 18), cost and d cost / d lattice (eq. 20).
void lattice_loss_sample(const float* lat, int T, int U1, int T_b, int U1_b,
                         const LatticeLossOptions& options, float* cost, float* grad, float* alpha,
                         float* beta) {
  auto at = [U1](int t, int u) { return static_cast<int64_t>(t) * U1 + u; };
  for (int t = 0; t < T_b; ++t) {
    for (int u = 0; u < U1_b; ++u) {
      if (t == 0 && u == 0) {
        alpha[0] = 0.f;
        continue;
      }
      const float a_t = t > 0 ? alpha[at(t - 1, u)] : kNegInf;
      const float b_t = t > 0 ? lat[2 * at(t - 1, u)] : 0.f;
      const float a_u = u > 0 ? alpha[at(t, u - 1)] : kNegInf;
      const float l_u = u > 0 ? lat[2 * at(t, u - 1) + 1] : 0.f;
      alpha[at(t, u)] = alpha_step(a_t, b_t, a_u, l_u);
    }
  }
  for (int t = T_b - 1; t >= 0; --t) {
    for (int u = U1_b - 1; u >= 0; --u) {
      const float blank = lat[2 * at(t, u)];
      if (t == T_b - 1 && u == U1_b - 1) {
        beta[at(t, u)] = blank;
        continue;
      }
      const float b_t = t + 1 < T_b ? beta[at(t + 1, u)] : kNegInf;
      const float b_u = u + 1 < U1_b ? beta[at(t, u + 1)] : kNegInf;
      beta[at(t, u)] = beta_step(b_t, blank, b_u, lat[2 * at(t, u) + 1]);
    }
  }
  const float log_prob = beta[0];
  *cost = -log_prob;
  std::memset(grad, 0, sizeof(float) * 2 * T * U1);
  // A sample with no valid alignment (or non-finite inputs) keeps a zero gradient.
  if (!std::isfinite(log_prob)) return;
  for (int t = 0; t < T_b; ++t) {
    for (int u = 0; u < U1_b; ++u) {
      const bool last_t = t + 1 == T_b, last_u = u + 1 == U1_b;
      const float beta_next_t = last_t ? (last_u ? 0.f : kNegInf) : beta[at(t + 1, u)];
      const float beta_next_u = last_u ? kNegInf : beta[at(t, u + 1)];
      const NodeGrad g =
          node_grad(alpha[at(t, u)], beta_next_t, beta_next_u, lat[2 * at(t, u)],
                    lat[2 * at(t, u) + 1], log_prob, options.fastemit_lambda, options.clamp);
      grad[2 * at(t, u)] = g.blank;
      grad[2 * at(t, u) + 1] = g.label;
    }
  }
}

template <typename Load>
void lattice_rows(const void* logits_ptr, const int32_t* labels, int T, int U1, int V, int blank,
                  float* lattice, float* lse, int64_t begin, int64_t end) {
  const auto* logits = static_cast<const typename Load::Storage*>(logits_ptr);
  for (int64_t node = begin; node < end; ++node) {
    const auto* row = logits + node * V;
    LseState s = lse_init();
    for (int v = 0; v < V; ++v) s = lse_push(s, Load::to_float(row[v]));
    const float total = lse_value(s);
    const int u = static_cast<int>(node % U1);
    const int64_t b = node / (static_cast<int64_t>(T) * U1);
    const int label = u + 1 < U1 ? labels[b * (U1 - 1) + u] : -1;
    lse[node] = total;
    lattice[2 * node] = log_softmax_at(Load::to_float(row[blank]), s);
    lattice[2 * node + 1] =
        (label >= 0 && label < V) ? log_softmax_at(Load::to_float(row[label]), s) : 0.f;
  }
}

template <typename Load>
void lattice_grad_rows(const void* logits_ptr, const int32_t* labels, int T, int U1, int V,
                       int blank, const float* lse, const float* d_lattice, void* d_logits_ptr,
                       int64_t begin, int64_t end) {
  using Storage = typename Load::Storage;
  const auto* logits = static_cast<const Storage*>(logits_ptr);
  auto* d_logits = static_cast<Storage*>(d_logits_ptr);
  for (int64_t node = begin; node < end; ++node) {
    const int u = static_cast<int>(node % U1);
    const int64_t b = node / (static_cast<int64_t>(T) * U1);
    int label = u + 1 < U1 ? labels[b * (U1 - 1) + u] : -1;
    if (label < 0 || label >= V) label = -1;
    const float g_blank = d_lattice[2 * node];
    const float g_label = label >= 0 ? d_lattice[2 * node + 1] : 0.f;
    const auto* row = logits + node * V;
    auto* out = d_logits + node * V;
    if (g_blank == 0.f && g_label == 0.f) {  // padding: exact zeros, no exp()
      for (int v = 0; v < V; ++v) out[v] = Load::from_float(0.f);
      continue;
    }
    for (int v = 0; v < V; ++v) {
      out[v] = Load::from_float(
          logit_grad(Load::to_float(row[v]), lse[node], v, blank, label, g_blank, g_label));
    }
  }
}

}  // namespace

Status lattice_loss_cpu(const float* lattice, const int32_t* logit_lengths,
                        const int32_t* label_lengths, int B, int T, int U1,
                        const LatticeLossOptions& options, float* costs, float* grads,
                        float* alphas, float* betas, const ParallelFor& parallel_for) {
  const int64_t per_sample = static_cast<int64_t>(T) * U1;
  parallel_for(B, per_sample * 200, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      lattice_loss_sample(lattice + 2 * b * per_sample, T, U1, logit_lengths[b],
                          label_lengths[b] + 1, options, costs + b, grads + 2 * b * per_sample,
                          alphas + b * per_sample, betas + b * per_sample);
    }
  });
  return Status();
}

Status logits_to_lattice_cpu(const void* logits, DType dtype, const int32_t* labels, int B, int T,
                             int U1, int V, int blank, float* lattice, float* lse,
                             const ParallelFor& parallel_for) {
  const int64_t nodes = static_cast<int64_t>(B) * T * U1;
  parallel_for(nodes, 20 * V, [&](int64_t begin, int64_t end) {
    dispatch_dtype(dtype, [&](auto load) {
      lattice_rows<decltype(load)>(logits, labels, T, U1, V, blank, lattice, lse, begin, end);
    });
  });
  return Status();
}

Status logits_to_lattice_grad_cpu(const void* logits, DType dtype, const int32_t* labels, int B,
                                  int T, int U1, int V, int blank, const float* lse,
                                  const float* d_lattice, void* d_logits,
                                  const ParallelFor& parallel_for) {
  const int64_t nodes = static_cast<int64_t>(B) * T * U1;
  parallel_for(nodes, 25 * V, [&](int64_t begin, int64_t end) {
    dispatch_dtype(dtype, [&](auto load) {
      lattice_grad_rows<decltype(load)>(logits, labels, T, U1, V, blank, lse, d_lattice, d_logits,
                                        begin, end);
    });
  });
  return Status();
}

}  // namespace tf_rnnt
