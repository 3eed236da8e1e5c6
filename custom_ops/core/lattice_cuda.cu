// CUDA RNN-T loss on a lattice and the logits -> lattice reduction.
#include "tf_rnnt/dtype_cuda.cuh"
#include "tf_rnnt/node_math.h"
#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {

namespace {

// One block per (sample, direction): the recursion walks anti-diagonals n = t + u, whose nodes
// depend only on the previous diagonal (eq. 16 for alpha, eq. 18 for beta). With use_shared the
// previous diagonal is kept in shared memory (2 * U1 floats, double-buffered, one barrier per
// diagonal), so each step's dependent reads hit shared memory; otherwise (very long label
// sequences) they are read back from the alphas/betas just written.
__global__ void alpha_beta_kernel(const float* __restrict__ lattice,
                                  const int32_t* __restrict__ logit_lengths,
                                  const int32_t* __restrict__ label_lengths, int T, int U1,
                                  bool use_shared, float* __restrict__ alphas,
                                  float* __restrict__ betas) {
  extern __shared__ float diagonals[];  // [2][U1] when use_shared
  const int b = blockIdx.x;
  const bool is_beta = blockIdx.y == 1;
  const int T_b = logit_lengths[b];
  const int U1_b = label_lengths[b] + 1;
  const int64_t base = static_cast<int64_t>(b) * T * U1;
  const float* lat = lattice + 2 * base;
  float* out = (is_beta ? betas : alphas) + base;
  const int last = T_b + U1_b - 2;  // index of the final diagonal
  for (int diag = 0; diag <= last; ++diag) {
    const float* prev = diagonals + ((diag + 1) & 1) * U1;
    float* cur = diagonals + (diag & 1) * U1;
    for (int u = threadIdx.x; u < U1_b; u += blockDim.x) {
      float value = kNegInf;
      // Alpha reads its predecessors (t-1, u) and (t, u-1); beta its successors (t+1, u) and
      // (t, u+1): position u and u -/+ 1 of the previous diagonal.
      const int t = is_beta ? last - diag - u : diag - u;
      if (t >= 0 && t < T_b) {
        const int64_t node = static_cast<int64_t>(t) * U1 + u;
        if (!is_beta) {
          if (diag == 0) {
            value = 0.f;
          } else {
            const float a_t = t > 0 ? (use_shared ? prev[u] : out[node - U1]) : kNegInf;
            const float a_u = u > 0 ? (use_shared ? prev[u - 1] : out[node - 1]) : kNegInf;
            value = alpha_step(a_t, t > 0 ? lat[2 * (node - U1)] : 0.f, a_u,
                               u > 0 ? lat[2 * (node - 1) + 1] : 0.f);
          }
        } else {
          const float blank = lat[2 * node];
          if (diag == 0) {
            value = blank;
          } else {
            const float b_t = t + 1 < T_b ? (use_shared ? prev[u] : out[node + U1]) : kNegInf;
            const float b_u = u + 1 < U1_b ? (use_shared ? prev[u + 1] : out[node + 1]) : kNegInf;
            value = beta_step(b_t, blank, b_u, lat[2 * node + 1]);
          }
        }
        out[node] = value;
      }
      if (use_shared) cur[u] = value;
    }
    __syncthreads();
  }
}

// One thread per node: eq. 20, zeros outside the valid rectangle, cost from beta(0, 0).
__global__ void lattice_grad_kernel(const float* __restrict__ lattice,
                                    const int32_t* __restrict__ logit_lengths,
                                    const int32_t* __restrict__ label_lengths, int B, int T, int U1,
                                    LatticeLossOptions options, const float* __restrict__ alphas,
                                    const float* __restrict__ betas, float* __restrict__ costs,
                                    float* __restrict__ grads) {
  const int64_t total = static_cast<int64_t>(B) * T * U1;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const auto [b, t, u] = lattice_node(i, T, U1);
    const int T_b = logit_lengths[b];
    const int U1_b = label_lengths[b] + 1;
    const int64_t base = static_cast<int64_t>(b) * T * U1;
    const float log_prob = betas[base];
    if (t == 0 && u == 0) costs[b] = -log_prob;
    float2 g = make_float2(0.f, 0.f);
    if (t < T_b && u < U1_b && isfinite(log_prob)) {
      const bool last_t = t + 1 == T_b, last_u = u + 1 == U1_b;
      const float beta_next_t = last_t ? (last_u ? 0.f : kNegInf) : betas[i + U1];
      const float beta_next_u = last_u ? kNegInf : betas[i + 1];
      const NodeGrad ng =
          node_grad(alphas[i], beta_next_t, beta_next_u, lattice[2 * i], lattice[2 * i + 1],
                    log_prob, options.fastemit_lambda, options.clamp);
      g = make_float2(ng.blank, ng.label);
    }
    reinterpret_cast<float2*>(grads)[i] = g;
  }
}

constexpr int kWarpsPerBlock = 8;

// One warp per node row of V logits: online log-sum-exp and the two picks.
template <typename T>
__global__ void logits_to_lattice_kernel(const T* __restrict__ logits,
                                         const int32_t* __restrict__ labels, int64_t nodes, int TU1,
                                         int U1, int V, int blank, float* __restrict__ lattice,
                                         float* __restrict__ lse) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t node = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + (threadIdx.x >> 5);
       node < nodes; node += warps) {
    const T* row = logits + node * V;
    LseState s = lse_init();
    for (int v = lane; v < V; v += 32) s = lse_push(s, to_float(row[v]));
    s = warp_lse(s);
    if (lane == 0) {
      const float total = lse_value(s);
      const int u = static_cast<int>(node % U1);
      const int64_t b = node / TU1;
      const int label = u + 1 < U1 ? labels[b * (U1 - 1) + u] : -1;
      lse[node] = total;
      lattice[2 * node] = log_softmax_at(to_float(row[blank]), s);
      lattice[2 * node + 1] =
          (label >= 0 && label < V) ? log_softmax_at(to_float(row[label]), s) : 0.f;
    }
  }
}

template <typename T>
__global__ void logits_to_lattice_grad_kernel(const T* logits, const int32_t* __restrict__ labels,
                                              int64_t nodes, int TU1, int U1, int V, int blank,
                                              const float* __restrict__ lse,
                                              const float* __restrict__ d_lattice, T* d_logits) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t node = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + (threadIdx.x >> 5);
       node < nodes; node += warps) {
    const int u = static_cast<int>(node % U1);
    const int64_t b = node / TU1;
    int label = u + 1 < U1 ? labels[b * (U1 - 1) + u] : -1;
    if (label < 0 || label >= V) label = -1;
    const float g_blank = d_lattice[2 * node];
    const float g_label = label >= 0 ? d_lattice[2 * node + 1] : 0.f;
    const float total = lse[node];
    const T* row = logits + node * V;
    T* out = d_logits + node * V;
    for (int v = lane; v < V; v += 32) {
      out[v] =
          from_float<T>(logit_grad(to_float(row[v]), total, v, blank, label, g_blank, g_label));
    }
  }
}

}  // namespace

Status lattice_loss_cuda(const float* lattice, const int32_t* logit_lengths,
                         const int32_t* label_lengths, int B, int T, int U1,
                         const LatticeLossOptions& options, float* costs, float* grads,
                         float* alphas, float* betas, GpuStream stream) {
  if (B == 0) return Status();
  auto s = static_cast<cudaStream_t>(stream);
  const int threads = diagonal_threads(U1);
  const size_t shared = 2 * sizeof(float) * static_cast<size_t>(U1);
  const bool use_shared = shared <= 48 * 1024;
  alpha_beta_kernel<<<dim3(B, 2), threads, use_shared ? shared : 0, s>>>(
      lattice, logit_lengths, label_lengths, T, U1, use_shared, alphas, betas);
  const int64_t total = static_cast<int64_t>(B) * T * U1;
  lattice_grad_kernel<<<blocks_for(total, 256), 256, 0, s>>>(
      lattice, logit_lengths, label_lengths, B, T, U1, options, alphas, betas, costs, grads);
  return last_launch_status();
}

namespace {

// launch(tag, blocks, stream) over the B T U1 nodes (a warp each) in dtype's type (tag).
template <typename Launch>
Status launch_per_node(DType dtype, int64_t nodes, GpuStream stream, Launch&& launch) {
  if (nodes == 0) return Status();
  const int blocks = blocks_for(nodes, kWarpsPerBlock);
  dispatch_dtype_cuda(dtype,
                      [&](auto tag) { launch(tag, blocks, static_cast<cudaStream_t>(stream)); });
  return last_launch_status();
}

}  // namespace

Status logits_to_lattice_cuda(const void* logits, DType dtype, const int32_t* labels, int B, int T,
                              int U1, int V, int blank, float* lattice, float* lse,
                              GpuStream stream) {
  const int64_t nodes = static_cast<int64_t>(B) * T * U1;
  return launch_per_node(dtype, nodes, stream, [&](auto tag, int blocks, cudaStream_t s) {
    using Tv = decltype(tag);
    logits_to_lattice_kernel<Tv><<<blocks, 32 * kWarpsPerBlock, 0, s>>>(
        static_cast<const Tv*>(logits), labels, nodes, T * U1, U1, V, blank, lattice, lse);
  });
}

Status logits_to_lattice_grad_cuda(const void* logits, DType dtype, const int32_t* labels, int B,
                                   int T, int U1, int V, int blank, const float* lse,
                                   const float* d_lattice, void* d_logits, GpuStream stream) {
  const int64_t nodes = static_cast<int64_t>(B) * T * U1;
  return launch_per_node(dtype, nodes, stream, [&](auto tag, int blocks, cudaStream_t s) {
    using Tv = decltype(tag);
    logits_to_lattice_grad_kernel<Tv><<<blocks, 32 * kWarpsPerBlock, 0, s>>>(
        static_cast<const Tv*>(logits), labels, nodes, T * U1, U1, V, blank, lse, d_lattice,
        static_cast<Tv*>(d_logits));
  });
}

}  // namespace tf_rnnt
