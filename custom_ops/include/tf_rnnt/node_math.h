// Per-lattice-node RNN-T math, written once for the CPU and CUDA paths.
//
// Notation (Graves 2012, "Sequence Transduction with Recurrent Neural Networks"):
//   blank(t, u) = log P(blank | t, u),  label(t, u) = log P(y_{u+1} | t, u)
//   alpha(t, u) = logaddexp(alpha(t-1, u) + blank(t-1, u), alpha(t, u-1) + label(t, u-1)) (16)
//   beta(t, u)  = logaddexp(beta(t+1, u) + blank(t, u),  beta(t, u+1) + label(t, u))      (18)
//   log P(y|x) = beta(0, 0) = alpha(T-1, U) + blank(T-1, U)
//   d cost / d blank(t, u) = -exp(alpha(t, u) + blank(t, u) + beta(t+1, u) - log P)        (20)
//   d cost / d label(t, u) = -exp(alpha(t, u) + label(t, u) + beta(t, u+1) - log P)
// (equation numbers of the paper)
#ifndef TF_RNNT_NODE_MATH_H_
#define TF_RNNT_NODE_MATH_H_

#include <cmath>
#include <cstdint>

#include "tf_rnnt/activation.h"

#if defined(__CUDACC__)
#define TF_RNNT_HD __host__ __device__ __forceinline__
#else
#define TF_RNNT_HD inline
#endif

namespace tf_rnnt {

constexpr float kNegInf = -INFINITY;

// log(exp(a) + exp(b)); exact for a == b == -inf (returns -inf, never NaN).
TF_RNNT_HD float log_add(float a, float b) {
  if (a == kNegInf) return b;
  if (b == kNegInf) return a;
  return a > b ? a + log1pf(expf(b - a)) : b + log1pf(expf(a - b));
}

// eq. 16: alpha(t, u) from its two predecessors; either may be absent (pass -inf).
TF_RNNT_HD float alpha_step(float alpha_prev_t, float blank_prev_t, float alpha_prev_u,
                            float label_prev_u) {
  return log_add(alpha_prev_t + blank_prev_t, alpha_prev_u + label_prev_u);
}

// eq. 18: beta(t, u) from its two successors; either may be absent (pass -inf).
TF_RNNT_HD float beta_step(float beta_next_t, float blank, float beta_next_u, float label) {
  return log_add(beta_next_t + blank, beta_next_u + label);
}

struct NodeGrad {
  float blank;
  float label;
};

// eq. 20 for one node, with FastEmit (Yu et al. 2021: label-emission gradient scaled by
// 1 + lambda) and an optional clamp (|g| <= clamp when clamp > 0).
// beta_next_t is beta(t+1, u) (0 for the final node t = T-1, u = U; -inf elsewhere at t = T-1);
// beta_next_u is beta(t, u+1) (-inf at u = U).
TF_RNNT_HD NodeGrad node_grad(float alpha, float beta_next_t, float beta_next_u, float blank,
                              float label, float log_prob, float fastemit_lambda, float clamp) {
  NodeGrad g;
  g.blank = beta_next_t == kNegInf ? 0.f : -expf(alpha + blank + beta_next_t - log_prob);
  g.label = beta_next_u == kNegInf
                ? 0.f
                : -(1.f + fastemit_lambda) * expf(alpha + label + beta_next_u - log_prob);
  if (clamp > 0.f) {
    g.blank = fminf(fmaxf(g.blank, -clamp), clamp);
    g.label = fminf(fmaxf(g.label, -clamp), clamp);
  }
  return g;
}

// Online log-sum-exp state (Milakov & Gimelshein 2018): running max and sum of exp(x - max).
struct LseState {
  float max;
  float sum;
};

TF_RNNT_HD LseState lse_init() { return LseState{kNegInf, 0.f}; }

TF_RNNT_HD LseState lse_push(LseState s, float x) {
  if (x == kNegInf) return s;  // a masked entry adds nothing (and -inf - -inf would be NaN)
  if (x <= s.max) {
    s.sum += expf(x - s.max);
  } else {
    s.sum = s.sum * expf(s.max - x) + 1.f;  // s.max == -inf gives 0 * 0 + 1
    s.max = x;
  }
  return s;
}

// exp() of the per-node math: expf by default; the fused GPU kernels' epilogues pass the
// hardware exp2 (__expf, a few ulp), where exp() runs once per logit.
struct ExactExp {
  TF_RNNT_HD float operator()(float x) const { return expf(x); }
};

// lse_push of n values at once: one rescale for the block, so the n exp() are independent.
// A block holding +inf falls back to lse_push element by element (same result).
template <typename Exp = ExactExp, int n>
TF_RNNT_HD LseState lse_push_block(LseState s, const float (&x)[n], Exp exp = Exp()) {
  float m = s.max;
  for (int k = 0; k < n; ++k) m = fmaxf(m, x[k]);  // fmaxf skips NaN; the sum below keeps it
  if (m == kNegInf) return s;
  if (m == INFINITY) {
    for (int k = 0; k < n; ++k) s = lse_push(s, x[k]);
    return s;
  }
  float sum = s.max == kNegInf ? 0.f : s.sum * exp(s.max - m);
  for (int k = 0; k < n; ++k) sum += exp(x[k] - m);  // exp(-inf) = 0: masked entries add nothing
  return LseState{m, sum};
}

TF_RNNT_HD LseState lse_merge(LseState a, LseState b) {
  if (a.max == kNegInf) return b;
  if (b.max == kNegInf) return a;
  if (a.max >= b.max) return LseState{a.max, a.sum + b.sum * expf(b.max - a.max)};
  return LseState{b.max, b.sum + a.sum * expf(a.max - b.max)};
}

TF_RNNT_HD float lse_value(LseState s) { return s.max + logf(s.sum); }

// log softmax(x) over the state's row, as (x - max) - log(sum). Forming x - (max + log(sum))
// instead loses log(sum) when |max| is large (near FLT_MAX one ulp exceeds any log(sum)).
TF_RNNT_HD float log_softmax_at(float x, LseState s) { return (x - s.max) - logf(s.sum); }

// d logits(v) for lattice = (logit(blank) - lse, logit(label) - lse):
//   g_blank * (1[v == blank] - p_v) + g_label * (1[v == label] - p_v)
// A node whose two gradients are zero (padding, or a sample whose cost is not finite) gets exact
// zeros, even where its logits are NaN or inf.
template <typename Exp = ExactExp>
TF_RNNT_HD float logit_grad(float logit, float lse, int v, int blank, int label, float g_blank,
                            float g_label, Exp exp = Exp()) {
  if (g_blank == 0.f && g_label == 0.f) return 0.f;
  float g = -exp(logit - lse) * (g_blank + g_label);
  if (v == blank) g += g_blank;
  if (v == label) g += g_label;
  return g;
}

// d logits of a TDT joint's duration column j (tdt_core.h), whose log-softmax over the D
// duration columns (log-sum-exp lse) feeds lattice channel 2 + j with gradient g_j; g_sum is the
// sum of the D channels' gradients:  g_j - softmax_j * g_sum.
template <typename Exp = ExactExp>
TF_RNNT_HD float duration_logit_grad(float logit, float lse, float g_j, float g_sum,
                                     Exp exp = Exp()) {
  if (g_sum == 0.f && g_j == 0.f) return 0.f;
  return g_j - exp(logit - lse) * g_sum;
}

TF_RNNT_HD float activate(float x, Activation activation) {
  switch (activation) {
    case Activation::kTanh:
      return tanhf(x);
    case Activation::kRelu:
      return x > 0.f ? x : 0.f;
    default:
      return x;
  }
}

// d act / d x expressed through the activated value y = act(x), so the backward pass needs only y.
TF_RNNT_HD float activation_grad(float y, Activation activation) {
  switch (activation) {
    case Activation::kTanh:
      return 1.f - y * y;
    case Activation::kRelu:
      return y > 0.f ? 1.f : 0.f;
    default:
      return 1.f;
  }
}

// Packed-node lookup for the fused joint: node n lies in sample b with
// offsets[b] <= n < offsets[b+1] (binary search), then (t, u) row-major in a (T_b, U_b + 1) block.
struct NodeIndex {
  int b, t, u;
};

TF_RNNT_HD NodeIndex locate_node(int64_t n, const int64_t* offsets, int B,
                                 const int32_t* label_lengths) {
  int lo = 0, hi = B - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (offsets[mid] <= n)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int64_t local = n - offsets[lo];
  const int U1_b = label_lengths[lo] + 1;
  NodeIndex idx;
  idx.b = lo;
  idx.t = static_cast<int>(local / U1_b);
  idx.u = static_cast<int>(local % U1_b);
  return idx;
}

}  // namespace tf_rnnt

#endif  // TF_RNNT_NODE_MATH_H_
