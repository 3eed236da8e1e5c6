// Times the CUDA joint launchers directly (no TensorFlow): forward and backward of the tiled joint
// with each GPU kernel path, and of untiled mode (cuBLAS or fused), on random inputs, with CUDA
// events (median of the repetitions).
//
//   build/tests/joint_timing [--B 32 --T 400 --U 128 --H 640 --V 1025] [--dtype bfloat16]
//                            [--lengths full|ragged] [--reps 20] [--budget-mb 256]
//                            [--kernels cublas,fused,untiled,untiled-fused] [--durations 0]
//
// --durations D > 0 times a TDT joint: D duration columns beside the V token columns.
//
// cuBLAS is loaded as in core_test ($TF_RNNT_CUBLAS, else the usual library names). The tile
// size follows the op's GPU default: as many nodes as fit the memory budget (untiled: every node,
// the budget aside). The GEMM rate counts the four GEMMs of 2 N H V each (N lattice nodes),
// whatever a path recomputes.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tf_rnnt/dtype_cpu.h"
#include "tf_rnnt/rnnt_core.h"

namespace {

using namespace tf_rnnt;  // NOLINT

#define CHECK_CUDA(expr)                                                                           \
  do {                                                                                             \
    const cudaError_t err = (expr);                                                                \
    if (err != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

void check(const Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "%s failed: status %d (%s)\n", what, static_cast<int>(st.code),
                 st.message);
    std::exit(1);
  }
}

void* device_random(size_t n, DType dtype, float lo, float hi, std::mt19937* rng) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<uint16_t> bits(dtype == DType::kFloat32 ? 0 : n);
  std::vector<float> values(dtype == DType::kFloat32 ? n : 0);
  for (size_t i = 0; i < n; ++i) {
    const float x = d(*rng);
    if (dtype == DType::kFloat32) {
      values[i] = x;
    } else {
      bits[i] = dtype == DType::kBFloat16 ? float_to_bf16_bits(x) : float_to_half_bits(x);
    }
  }
  void* ptr = nullptr;
  const size_t bytes = n * dtype_size(dtype);
  CHECK_CUDA(cudaMalloc(&ptr, std::max<size_t>(bytes, 1)));
  CHECK_CUDA(cudaMemcpy(ptr,
                        dtype == DType::kFloat32 ? static_cast<const void*>(values.data())
                                                 : static_cast<const void*>(bits.data()),
                        bytes, cudaMemcpyHostToDevice));
  return ptr;
}

template <typename T>
T* device_copy(const std::vector<T>& host) {
  T* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, sizeof(T) * std::max<size_t>(host.size(), 1)));
  CHECK_CUDA(cudaMemcpy(ptr, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice));
  return ptr;
}

bool load_cublas() {
  const char* path = std::getenv("TF_RNNT_CUBLAS");
  if (path && *path) return dlopen(path, RTLD_NOW | RTLD_GLOBAL) != nullptr;
  for (const char* name : {"libcublas.so.12", "libcublas.so.13", "libcublas.so"}) {
    if (dlopen(name, RTLD_NOW | RTLD_GLOBAL)) return true;
  }
  return false;
}

float median(std::vector<float> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int B = 32, T = 400, U = 128, H = 640, V = 1025, D = 0, reps = 20;
  int64_t budget_mb = 256;
  std::string dtype_name = "bfloat16", lengths = "full", kernels = "cublas,fused";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--B")
      B = std::stoi(v);
    else if (k == "--T")
      T = std::stoi(v);
    else if (k == "--U")
      U = std::stoi(v);
    else if (k == "--H")
      H = std::stoi(v);
    else if (k == "--V")
      V = std::stoi(v);
    else if (k == "--durations")
      D = std::stoi(v);
    else if (k == "--reps")
      reps = std::stoi(v);
    else if (k == "--budget-mb")
      budget_mb = std::stoll(v);
    else if (k == "--dtype")
      dtype_name = v;
    else if (k == "--lengths")
      lengths = v;
    else if (k == "--kernels")
      kernels = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (!load_cublas()) {
    std::fprintf(stderr, "no cuBLAS: set TF_RNNT_CUBLAS to libcublas.so's path\n");
    return 1;
  }
  const DType dtype = dtype_name == "float32"   ? DType::kFloat32
                      : dtype_name == "float16" ? DType::kFloat16
                                                : DType::kBFloat16;
  std::mt19937 rng(0);
  std::vector<int32_t> t_len(B, T), u_len(B, U);
  if (lengths == "ragged") {  // as benchmarks/bench_rnnt.py: uniform in [T/2, T], [U/2, U]
    std::uniform_int_distribution<int> dt(T / 2, T), du(U / 2, U);
    for (int b = 1; b < B; ++b) {
      t_len[b] = dt(rng);
      u_len[b] = du(rng);
    }
  }
  std::vector<int32_t> labels(static_cast<size_t>(B) * U);
  std::uniform_int_distribution<int> dl(0, V - 2);
  for (int32_t& y : labels) y = dl(rng);  // blank = V - 1
  // V token columns, then D duration columns (blank = V - 1 is a token).
  JointShape s{B, T, U + 1, H, V + D, D};
  const int C = lattice_channels(s), W = V + D;
  std::vector<int64_t> offsets(B + 1);
  joint_node_offsets(t_len.data(), u_len.data(), B, offsets.data());
  const int64_t N = offsets[B];
  const float w = 4.f / std::sqrt(static_cast<float>(H));
  void* enc = device_random(static_cast<size_t>(B) * T * H, dtype, -1, 1, &rng);
  void* pred = device_random(static_cast<size_t>(B) * (U + 1) * H, dtype, -1, 1, &rng);
  void* kernel = device_random(static_cast<size_t>(H) * W, dtype, -w, w, &rng);
  void* bias = device_random(W, dtype, -0.5f, 0.5f, &rng);
  float* d_lattice = static_cast<float*>(
      device_random(static_cast<size_t>(B) * T * (U + 1) * C, DType::kFloat32, -1e-3f, 0, &rng));
  int32_t* d_labels = device_copy(labels);
  int32_t* d_t = device_copy(t_len);
  int32_t* d_u = device_copy(u_len);
  float *lattice, *lse;
  CHECK_CUDA(cudaMalloc(&lattice, sizeof(float) * B * T * (U + 1) * C));
  CHECK_CUDA(cudaMalloc(&lse, sizeof(float) * std::max<int64_t>(N, 1)));
  void* grads[4];
  const size_t grad_sizes[4] = {static_cast<size_t>(B) * T * H,
                                static_cast<size_t>(B) * (U + 1) * H, static_cast<size_t>(H) * W,
                                static_cast<size_t>(W)};
  for (int k = 0; k < 4; ++k) CHECK_CUDA(cudaMalloc(&grads[k], grad_sizes[k] * dtype_size(dtype)));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cudaEvent_t e0, e1, e2;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  CHECK_CUDA(cudaEventCreate(&e2));
  const double flop = 4.0 * 2.0 * static_cast<double>(N) * H * V;
  std::printf("B=%d T=%d U=%d H=%d V=%d D=%d %s, %s lengths: %lld nodes, 4 GEMMs = %.2f TFLOP\n", B,
              T, U, H, V, D, dtype_name.c_str(), lengths.c_str(), static_cast<long long>(N),
              flop / 1e12);
  std::printf(
      "| kernels | tile nodes | forward | backward | total | GEMM rate "
      "|\n|---|---|---|---|---|---|\n");
  size_t start = 0;
  while (start < kernels.size()) {
    size_t end = kernels.find(',', start);
    if (end == std::string::npos) end = kernels.size();
    const std::string name = kernels.substr(start, end - start);
    start = end + 1;
    JointOptions o;
    o.blank = V - 1;
    o.dtype = dtype;
    o.kernel =
        name == "fused" || name == "untiled-fused" ? JointKernel::kFused : JointKernel::kCublas;
    const bool untiled = name == "untiled" || name == "untiled-fused";
    const int64_t per_node =
        (static_cast<int64_t>(joint_workspace_bytes_cuda(s, o, 2048, true, false)) -
         static_cast<int64_t>(joint_workspace_bytes_cuda(s, o, 1024, true, false))) /
        1024;
    const int64_t tile =
        untiled ? N
                : std::max<int64_t>(
                      1, std::min<int64_t>(N, (budget_mb << 20) / std::max<int64_t>(per_node, 1)));
    const size_t bytes = std::max(joint_workspace_bytes_cuda(s, o, tile, false, untiled),
                                  joint_workspace_bytes_cuda(s, o, tile, true, untiled));
    void* workspace = nullptr;
    CHECK_CUDA(cudaMalloc(&workspace, bytes));
    const JointSavedSizes kept = joint_saved_sizes_cuda(s, o, untiled ? N : 0);
    void* saved_hidden = nullptr;
    float* saved_logits = nullptr;
    if (untiled) {
      CHECK_CUDA(cudaMalloc(&saved_hidden, std::max<size_t>(kept.hidden * dtype_size(dtype), 1)));
      CHECK_CUDA(cudaMalloc(&saved_logits, std::max<size_t>(kept.logits * sizeof(float), 1)));
    }
    JointInputs in;
    in.encoder = enc;
    in.predictor = pred;
    in.kernel = kernel;
    in.bias = bias;
    in.labels = d_labels;
    in.logit_lengths = d_t;
    in.label_lengths = d_u;
    in.host.logit_lengths = t_len.data();
    in.host.label_lengths = u_len.data();
    in.host.node_offsets = offsets.data();
    in.host.num_nodes = N;
    in.host.tile_nodes = tile;
    JointForwardArgs f;
    f.in = in;
    f.workspace = workspace;
    f.lattice = lattice;
    f.lse = lse;
    f.saved_hidden = saved_hidden;
    f.saved_logits = saved_logits;
    JointBackwardArgs g;
    g.in = in;
    g.workspace = workspace;
    g.lse = lse;
    g.d_lattice = d_lattice;
    g.d_encoder = grads[0];
    g.d_predictor = grads[1];
    g.d_kernel = grads[2];
    g.d_bias = grads[3];
    g.saved_hidden = saved_hidden;
    g.saved_logits = saved_logits;
    std::vector<float> fwd, bwd;
    for (int r = 0; r < reps + 3; ++r) {
      CHECK_CUDA(cudaEventRecord(e0, stream));
      check(joint_forward_cuda(s, o, f, stream), "forward");
      CHECK_CUDA(cudaEventRecord(e1, stream));
      check(joint_backward_cuda(s, o, g, stream), "backward");
      CHECK_CUDA(cudaEventRecord(e2, stream));
      CHECK_CUDA(cudaEventSynchronize(e2));
      float a = 0, b = 0;
      CHECK_CUDA(cudaEventElapsedTime(&a, e0, e1));
      CHECK_CUDA(cudaEventElapsedTime(&b, e1, e2));
      if (r >= 3) {
        fwd.push_back(a);
        bwd.push_back(b);
      }
    }
    const float tf = median(fwd), tb = median(bwd);
    std::printf("| %s | %lld | %.2f ms | %.2f ms | %.2f ms | %.0f TFLOP/s |\n", name.c_str(),
                static_cast<long long>(tile), tf, tb, tf + tb, flop / ((tf + tb) * 1e-3) / 1e12);
    CHECK_CUDA(cudaFree(workspace));
    CHECK_CUDA(cudaFree(saved_hidden));
    CHECK_CUDA(cudaFree(saved_logits));
  }
  return 0;
}
