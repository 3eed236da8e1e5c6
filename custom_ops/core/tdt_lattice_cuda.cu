// CUDA TDT loss on a lattice (tdt_core.h).
#include "tf_rnnt/dtype_cuda.cuh"
#include "tf_rnnt/tdt_core.h"

namespace tf_rnnt {

namespace {

// One block per (sample, direction) walks the anti-diagonals n = t + u, threads over u. A move of
// duration d spans d (blank) or d + 1 (label) diagonals, so each diagonal reads only finished
// ones: alpha walks them forward, beta backward, with one barrier per diagonal. The values read
// lie up to max(durations) + 1 diagonals back, so they are read from the alphas/betas written
// (the barrier makes a block's global writes visible to its threads).
__global__ void tdt_alpha_beta_kernel(const float* __restrict__ lattice,
                                      const int32_t* __restrict__ logit_lengths,
                                      const int32_t* __restrict__ label_lengths, int T, int U1,
                                      TdtLossOptions options, float* alphas, float* betas) {
  const int b = blockIdx.x;
  const bool is_beta = blockIdx.y == 1;
  const int T_b = logit_lengths[b];
  const int U_b = label_lengths[b];
  const int64_t base = static_cast<int64_t>(b) * T * U1;
  const float* lat = lattice + (2 + options.num_durations) * base;
  float* out = (is_beta ? betas : alphas) + base;
  const int last = T_b + U_b - 1;  // index of the final diagonal
  for (int step = 0; step <= last; ++step) {
    const int diag = is_beta ? last - step : step;
    for (int u = threadIdx.x; u <= U_b; u += blockDim.x) {
      const int t = diag - u;
      if (t < 0 || t >= T_b) continue;
      float value;
      if (is_beta) {
        value = tdt_beta(lat, out, t, u, T_b, U_b, U1, options);
      } else {
        value = diag == 0 ? 0.f : tdt_alpha(lat, out, t, u, U1, options);
      }
      out[static_cast<int64_t>(t) * U1 + u] = value;
    }
    __syncthreads();
  }
}

// One thread per node: its C gradient channels (zeros outside the valid rectangle and for a
// sample whose cost is not finite); the cost from beta(0, 0).
__global__ void tdt_grad_kernel(const float* __restrict__ lattice,
                                const int32_t* __restrict__ logit_lengths,
                                const int32_t* __restrict__ label_lengths, int B, int T, int U1,
                                TdtLossOptions options, const float* __restrict__ alphas,
                                const float* __restrict__ betas, float* __restrict__ costs,
                                float* __restrict__ grads) {
  const int C = 2 + options.num_durations;
  const int64_t total = static_cast<int64_t>(B) * T * U1;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const auto [b, t, u] = lattice_node(i, T, U1);
    const int T_b = logit_lengths[b];
    const int U_b = label_lengths[b];
    const int64_t base = static_cast<int64_t>(b) * T * U1;
    const float log_prob = betas[base];
    if (t == 0 && u == 0) costs[b] = -log_prob;
    float* g = grads + C * i;
    if (t < T_b && u <= U_b && isfinite(log_prob)) {
      tdt_node_grad(lattice + C * base, alphas + base, betas + base, t, u, T_b, U_b, U1, log_prob,
                    options, g);
    } else {
      for (int c = 0; c < C; ++c) g[c] = 0.f;
    }
  }
}

}  // namespace

Status tdt_lattice_loss_cuda(const float* lattice, const int32_t* logit_lengths,
                             const int32_t* label_lengths, int B, int T, int U1,
                             const TdtLossOptions& options, float* costs, float* grads,
                             float* alphas, float* betas, GpuStream stream) {
  if (const char* error = tdt_options_error(options)) {
    Status s;
    s.code = StatusCode::kInvalidArgument;
    s.message = error;
    return s;
  }
  if (B == 0) return Status();
  auto s = static_cast<cudaStream_t>(stream);
  const int threads = diagonal_threads(U1);
  tdt_alpha_beta_kernel<<<dim3(B, 2), threads, 0, s>>>(lattice, logit_lengths, label_lengths, T, U1,
                                                       options, alphas, betas);
  const int64_t total = static_cast<int64_t>(B) * T * U1;
  tdt_grad_kernel<<<blocks_for(total, 256), 256, 0, s>>>(
      lattice, logit_lengths, label_lengths, B, T, U1, options, alphas, betas, costs, grads);
  return last_launch_status();
}

}  // namespace tf_rnnt
