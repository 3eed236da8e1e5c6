// The float64 brute-force references core_test.cc checks the launchers against (included by
// core_test.cc alone, inside its anonymous namespace).
#ifndef TF_RNNT_CORE_TEST_REFERENCE_H_
#define TF_RNNT_CORE_TEST_REFERENCE_H_

double log_sum_exp(const std::vector<double>& x) {
  double m = -INFINITY;
  for (double v : x) m = std::max(m, v);
  if (m == -INFINITY) return m;
  double s = 0;
  for (double v : x) s += std::exp(v - m);
  return m + std::log(s);
}

// Every alignment of sample b (a monotone path from (0, 0) to (T_b - 1, U_b), then the final
// blank): cost = -log sum_paths P(path); d cost / d edge = -sum over paths through the edge of
// P(path) / P, with FastEmit's (1 + lambda) on label edges and the optional clamp.
void lattice_loss_reference(const std::vector<float>& lattice, const std::vector<int32_t>& T_len,
                            const std::vector<int32_t>& U_len, int B, int T, int U1,
                            const LatticeLossOptions& options, std::vector<double>* costs,
                            std::vector<double>* grads) {
  costs->assign(B, 0.0);
  grads->assign(lattice.size(), 0.0);
  for (int b = 0; b < B; ++b) {
    auto edge = [&](int t, int u, int k) {
      return ((static_cast<size_t>(b) * T + t) * U1 + u) * 2 + k;
    };
    std::vector<double> log_probs;
    std::vector<std::vector<size_t>> paths;
    std::vector<size_t> path;
    std::function<void(int, int, double)> walk = [&](int t, int u, double lp) {
      if (t == T_len[b] - 1 && u == U_len[b]) {
        path.push_back(edge(t, u, 0));
        log_probs.push_back(lp + lattice[edge(t, u, 0)]);
        paths.push_back(path);
        path.pop_back();
        return;
      }
      if (t + 1 < T_len[b]) {
        path.push_back(edge(t, u, 0));
        walk(t + 1, u, lp + lattice[edge(t, u, 0)]);
        path.pop_back();
      }
      if (u < U_len[b]) {
        path.push_back(edge(t, u, 1));
        walk(t, u + 1, lp + lattice[edge(t, u, 1)]);
        path.pop_back();
      }
    };
    walk(0, 0, 0.0);
    const double log_p = log_sum_exp(log_probs);
    (*costs)[b] = -log_p;
    for (size_t p = 0; p < paths.size(); ++p) {
      for (size_t e : paths[p]) (*grads)[e] -= std::exp(log_probs[p] - log_p);
    }
    for (int t = 0; t < T; ++t) {
      for (int u = 0; u < U1; ++u) {
        double& g_label = (*grads)[edge(t, u, 1)];
        g_label *= 1.0 + options.fastemit_lambda;
        if (options.clamp > 0) {
          for (int k = 0; k < 2; ++k) {
            double& g = (*grads)[edge(t, u, k)];
            g = std::min<double>(std::max<double>(g, -options.clamp), options.clamp);
          }
        }
      }
    }
  }
}

// Log-softmax of each V-row of logits at blank and the next label; its log-sum-exp.
void log_softmax_picks(const std::vector<double>& logits, const std::vector<int32_t>& labels, int B,
                       int T, int U1, int V, int blank, std::vector<double>* lattice,
                       std::vector<double>* lse) {
  const size_t nodes = static_cast<size_t>(B) * T * U1;
  lattice->assign(2 * nodes, 0.0);
  lse->assign(nodes, 0.0);
  for (size_t n = 0; n < nodes; ++n) {
    std::vector<double> row(logits.begin() + n * V, logits.begin() + (n + 1) * V);
    const double total = log_sum_exp(row);
    const int u = static_cast<int>(n % U1);
    const size_t b = n / (static_cast<size_t>(T) * U1);
    const int label = u + 1 < U1 ? labels[b * (U1 - 1) + u] : -1;
    (*lse)[n] = total;
    (*lattice)[2 * n] = row[blank] - total;
    if (label >= 0 && label < V) (*lattice)[2 * n + 1] = row[label] - total;
  }
}

// d logits of sum(d_lattice * picks): g_blank (1[v = blank] - p_v) + g_label (1[v = label] - p_v).
std::vector<double> log_softmax_picks_grad(const std::vector<double>& logits,
                                           const std::vector<int32_t>& labels, int B, int T, int U1,
                                           int V, int blank, const std::vector<double>& d_lattice) {
  std::vector<double> lattice, lse, out(logits.size(), 0.0);
  log_softmax_picks(logits, labels, B, T, U1, V, blank, &lattice, &lse);
  for (size_t n = 0; n < lse.size(); ++n) {
    const int u = static_cast<int>(n % U1);
    const size_t b = n / (static_cast<size_t>(T) * U1);
    const int label = u + 1 < U1 ? labels[b * (U1 - 1) + u] : -1;
    const double g_blank = d_lattice[2 * n];
    const double g_label = (label >= 0 && label < V) ? d_lattice[2 * n + 1] : 0.0;
    for (int v = 0; v < V; ++v) {
      const double p = std::exp(logits[n * V + v] - lse[n]);
      double g = -(g_blank + g_label) * p;
      if (v == blank) g += g_blank;
      if (v == label) g += g_label;
      out[n * V + v] = g;
    }
  }
  return out;
}

double activate64(double x, Activation a) {
  if (a == Activation::kTanh) return std::tanh(x);
  if (a == Activation::kRelu) return x > 0 ? x : 0;
  return x;
}

double activate64_grad(double x, Activation a) {
  if (a == Activation::kTanh) return 1 - std::tanh(x) * std::tanh(x);
  if (a == Activation::kRelu) return x > 0 ? 1 : 0;
  return 1;
}

bool valid_node(const JointCase& c, int b, int t, int u) {
  return t < c.logit_lengths[b] && u <= c.label_lengths[b];
}

// The joint's lattice (0 outside the valid nodes; 2 + D channels) and the gradients of
// sum(d_lattice * lattice).
void joint_reference(const JointCase& c, const std::vector<float>& d_lattice,
                     std::vector<double>* lattice, std::vector<double>* d_enc,
                     std::vector<double>* d_pred, std::vector<double>* d_kernel,
                     std::vector<double>* d_bias) {
  const JointShape& s = c.shape;
  const int B = s.B, T = s.T, U1 = s.U1, H = s.H, V = s.V;
  const size_t nodes = static_cast<size_t>(B) * T * U1;
  std::vector<double> pre(nodes * H), z(nodes * H), logits(nodes * V);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      for (int u = 0; u < U1; ++u) {
        const size_t n = (static_cast<size_t>(b) * T + t) * U1 + u;
        for (int h = 0; h < H; ++h) {
          pre[n * H + h] =
              static_cast<double>(c.encoder[(static_cast<size_t>(b) * T + t) * H + h]) +
              c.predictor[(static_cast<size_t>(b) * U1 + u) * H + h];
          z[n * H + h] = activate64(pre[n * H + h], c.options.activation);
        }
        for (int v = 0; v < V; ++v) {
          double x = c.bias[v];
          for (int h = 0; h < H; ++h) x += z[n * H + h] * c.kernel[static_cast<size_t>(h) * V + v];
          logits[n * V + v] = x;
        }
      }
    }
  }
  // A TDT joint (D > 0): the token picks over the first Vt columns, a log-softmax over the last
  // D into channels 2 .. 2 + D (tdt_core.h).
  const int D = s.D, Vt = V - D, C = 2 + D;
  std::vector<double> token(nodes * Vt), lse, picks;
  for (size_t n = 0; n < nodes; ++n) {
    for (int v = 0; v < Vt; ++v) token[n * Vt + v] = logits[n * V + v];
  }
  log_softmax_picks(token, c.labels, B, T, U1, Vt, c.options.blank, &picks, &lse);
  std::vector<double> dur_lse(nodes, 0.0);
  lattice->assign(nodes * C, 0.0);
  for (size_t n = 0; n < nodes; ++n) {
    (*lattice)[C * n] = picks[2 * n];
    (*lattice)[C * n + 1] = picks[2 * n + 1];
    if (D == 0) continue;
    double m = -INFINITY, sum = 0;
    for (int j = 0; j < D; ++j) m = std::max(m, logits[n * V + Vt + j]);
    for (int j = 0; j < D; ++j) sum += std::exp(logits[n * V + Vt + j] - m);
    dur_lse[n] = m + std::log(sum);
    for (int j = 0; j < D; ++j) (*lattice)[C * n + 2 + j] = logits[n * V + Vt + j] - dur_lse[n];
  }
  std::vector<double> d_lat(d_lattice.begin(), d_lattice.end());
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      for (int u = 0; u < U1; ++u) {
        const size_t n = (static_cast<size_t>(b) * T + t) * U1 + u;
        if (!valid_node(c, b, t, u)) {
          for (int k = 0; k < C; ++k) (*lattice)[C * n + k] = d_lat[C * n + k] = 0;
        } else if (u == c.label_lengths[b]) {
          (*lattice)[C * n + 1] = 0;
          d_lat[C * n + 1] = 0;
        }
      }
    }
  }
  std::vector<double> d_picks(2 * nodes);
  for (size_t n = 0; n < nodes; ++n) {
    d_picks[2 * n] = d_lat[C * n];
    d_picks[2 * n + 1] = d_lat[C * n + 1];
  }
  const std::vector<double> d_token =
      log_softmax_picks_grad(token, c.labels, B, T, U1, Vt, c.options.blank, d_picks);
  std::vector<double> d_logits(nodes * V, 0.0);
  for (size_t n = 0; n < nodes; ++n) {
    for (int v = 0; v < Vt; ++v) d_logits[n * V + v] = d_token[n * Vt + v];
    double g_sum = 0;
    for (int j = 0; j < D; ++j) g_sum += d_lat[C * n + 2 + j];
    for (int j = 0; j < D; ++j) {
      d_logits[n * V + Vt + j] =
          d_lat[C * n + 2 + j] - std::exp(logits[n * V + Vt + j] - dur_lse[n]) * g_sum;
    }
  }
  d_enc->assign(static_cast<size_t>(B) * T * H, 0.0);
  d_pred->assign(static_cast<size_t>(B) * U1 * H, 0.0);
  d_kernel->assign(static_cast<size_t>(H) * V, 0.0);
  d_bias->assign(V, 0.0);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      for (int u = 0; u < U1; ++u) {
        const size_t n = (static_cast<size_t>(b) * T + t) * U1 + u;
        for (int v = 0; v < V; ++v) (*d_bias)[v] += d_logits[n * V + v];
        for (int h = 0; h < H; ++h) {
          double dz = 0;
          for (int v = 0; v < V; ++v) {
            dz += d_logits[n * V + v] * c.kernel[static_cast<size_t>(h) * V + v];
            (*d_kernel)[static_cast<size_t>(h) * V + v] += z[n * H + h] * d_logits[n * V + v];
          }
          const double g = dz * activate64_grad(pre[n * H + h], c.options.activation);
          (*d_enc)[(static_cast<size_t>(b) * T + t) * H + h] += g;
          (*d_pred)[(static_cast<size_t>(b) * U1 + u) * H + h] += g;
        }
      }
    }
  }
}

#endif  // TF_RNNT_CORE_TEST_REFERENCE_H_
