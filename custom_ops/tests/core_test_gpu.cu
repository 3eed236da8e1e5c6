// GPU backend of core_test: copies each case to the device, calls the CUDA launchers and copies
// the results back.
//
// The joint's GEMMs need cuBLAS, which the library takes from the process (TensorFlow has loaded
// it). This program has no TensorFlow, so before the first launch it loads libcublas itself:
// $TF_RNNT_CUBLAS if set (a full path, e.g. the nvidia-cublas pip wheel's
// site-packages/nvidia/cublas/lib/libcublas.so.12), else the names the library's loader tries,
// on the loader's search path (LD_LIBRARY_PATH). tests/gpu/run.sh core sets $TF_RNNT_CUBLAS from
// the installed wheel.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core_test.h"
#include "joint_fused.h"
#include "tf_rnnt/cuda_status.h"
#include "tf_rnnt/dtype_cpu.h"

namespace tf_rnnt {
namespace test {
namespace {

// A device copy of a host vector (or an uninitialized buffer of n elements).
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) { cudaMalloc(&ptr, sizeof(T) * (n ? n : 1)); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    cudaMemcpy(ptr, host.data(), sizeof(T) * n, cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void to_host(std::vector<T>* out) const {
    out->resize(n);
    cudaMemcpy(out->data(), ptr, sizeof(T) * n, cudaMemcpyDeviceToHost);
  }
};

// A device copy of float values in a joint dtype (16-bit formats rounded to nearest even), and
// back to float.
class DeviceValues {
 public:
  DeviceValues(const std::vector<float>& host, DType dtype) : dtype_(dtype), n_(host.size()) {
    if (dtype == DType::kFloat32) {
      f32_.reset(new DeviceBuffer<float>(host));
      return;
    }
    std::vector<uint16_t> bits(n_);
    for (size_t i = 0; i < n_; ++i) {
      bits[i] =
          dtype == DType::kBFloat16 ? float_to_bf16_bits(host[i]) : float_to_half_bits(host[i]);
    }
    b16_.reset(new DeviceBuffer<uint16_t>(bits));
  }
  DeviceValues(size_t n, DType dtype) : DeviceValues(std::vector<float>(n, -1.f), dtype) {}
  void* ptr() const { return f32_ ? static_cast<void*>(f32_->ptr) : static_cast<void*>(b16_->ptr); }
  void to_host(std::vector<float>* out) const {
    if (f32_) return f32_->to_host(out);
    std::vector<uint16_t> bits;
    b16_->to_host(&bits);
    out->resize(n_);
    for (size_t i = 0; i < n_; ++i) {
      (*out)[i] =
          dtype_ == DType::kBFloat16 ? bf16_bits_to_float(bits[i]) : half_bits_to_float(bits[i]);
    }
  }

 private:
  DType dtype_;
  size_t n_;
  std::unique_ptr<DeviceBuffer<float>> f32_;
  std::unique_ptr<DeviceBuffer<uint16_t>> b16_;
};

// The launcher's status, else the first CUDA error of the launches (synchronized).
Status finish(Status st) {
  const cudaError_t err = cudaDeviceSynchronize();
  return st.ok() ? cuda_status(err) : st;
}

class GpuBackend : public Backend {
 public:
  const char* name() const override { return "gpu"; }

  Status lattice_loss(const std::vector<float>& lattice, const std::vector<int32_t>& logit_lengths,
                      const std::vector<int32_t>& label_lengths, int B, int T, int U1,
                      const LatticeLossOptions& options, std::vector<float>* costs,
                      std::vector<float>* grads) override {
    DeviceBuffer<float> d_lattice(lattice), d_costs(B), d_grads(lattice.size());
    DeviceBuffer<float> alphas(static_cast<size_t>(B) * T * U1), betas(alphas.n);
    DeviceBuffer<int32_t> d_t(logit_lengths), d_u(label_lengths);
    const Status st =
        finish(lattice_loss_cuda(d_lattice.ptr, d_t.ptr, d_u.ptr, B, T, U1, options, d_costs.ptr,
                                 d_grads.ptr, alphas.ptr, betas.ptr, nullptr));
    d_costs.to_host(costs);
    d_grads.to_host(grads);
    return st;
  }

  Status logits_to_lattice(const std::vector<float>& logits, const std::vector<int32_t>& labels,
                           int B, int T, int U1, int V, int blank, std::vector<float>* lattice,
                           std::vector<float>* lse) override {
    const size_t nodes = static_cast<size_t>(B) * T * U1;
    DeviceBuffer<float> d_logits(logits), d_lattice(2 * nodes), d_lse(nodes);
    DeviceBuffer<int32_t> d_labels(labels);
    const Status st =
        finish(logits_to_lattice_cuda(d_logits.ptr, DType::kFloat32, d_labels.ptr, B, T, U1, V,
                                      blank, d_lattice.ptr, d_lse.ptr, nullptr));
    d_lattice.to_host(lattice);
    d_lse.to_host(lse);
    return st;
  }

  Status logits_to_lattice_grad(const std::vector<float>& logits,
                                const std::vector<int32_t>& labels, int B, int T, int U1, int V,
                                int blank, const std::vector<float>& lse,
                                const std::vector<float>& d_lattice,
                                std::vector<float>* d_logits) override {
    DeviceBuffer<float> d_in(logits), d_lse(lse), d_lat(d_lattice), d_out(logits.size());
    DeviceBuffer<int32_t> d_labels(labels);
    const Status st =
        finish(logits_to_lattice_grad_cuda(d_in.ptr, DType::kFloat32, d_labels.ptr, B, T, U1, V,
                                           blank, d_lse.ptr, d_lat.ptr, d_out.ptr, nullptr));
    d_out.to_host(d_logits);
    return st;
  }

  Status joint(const JointCase& c, int64_t tile_nodes, const std::vector<float>& d_lattice,
               JointResult* r) override {
    const JointShape& s = c.shape;
    std::vector<int64_t> offsets(s.B + 1);
    joint_node_offsets(c.logit_lengths.data(), c.label_lengths.data(), s.B, offsets.data());
    const int64_t N = offsets[s.B];
    const bool untiled = tile_nodes <= 0;
    const DType dtype = c.options.dtype;
    DeviceValues enc(c.encoder, dtype), pred(c.predictor, dtype), kernel(c.kernel, dtype),
        bias(c.bias, dtype);
    DeviceBuffer<int32_t> labels(c.labels), t_len(c.logit_lengths), u_len(c.label_lengths);
    JointInputs in;
    in.encoder = enc.ptr();
    in.predictor = pred.ptr();
    in.kernel = kernel.ptr();
    in.bias = bias.ptr();
    in.labels = labels.ptr;
    in.logit_lengths = t_len.ptr;
    in.label_lengths = u_len.ptr;
    in.host.logit_lengths = c.logit_lengths.data();
    in.host.label_lengths = c.label_lengths.data();
    in.host.node_offsets = offsets.data();
    in.host.num_nodes = N;
    in.host.tile_nodes = untiled ? N : tile_nodes;
    const JointSavedSizes saved = joint_saved_sizes_cuda(s, c.options, untiled ? N : 0);
    DeviceValues saved_hidden(saved.hidden, dtype);
    DeviceBuffer<float> saved_logits(saved.logits);
    const size_t bytes =
        std::max(joint_workspace_bytes_cuda(s, c.options, in.host.tile_nodes, false, untiled),
                 joint_workspace_bytes_cuda(s, c.options, in.host.tile_nodes, true, untiled));
    DeviceBuffer<char> workspace(bytes);
    DeviceBuffer<float> lattice(static_cast<size_t>(s.B) * s.T * s.U1 * lattice_channels(s)),
        lse(N);
    cudaMemset(lattice.ptr, 0xff, sizeof(float) * lattice.n);  // NaN: every value must be written
    cudaMemset(lse.ptr, 0xff, sizeof(float) * lse.n);
    JointForwardArgs f;
    f.in = in;
    f.workspace = workspace.ptr;
    f.lattice = lattice.ptr;
    f.lse = lse.ptr;
    f.saved_hidden = untiled ? saved_hidden.ptr() : nullptr;
    f.saved_logits = untiled ? saved_logits.ptr : nullptr;
    Status st = finish(joint_forward_cuda(s, c.options, f, nullptr));
    lattice.to_host(&r->lattice);
    lse.to_host(&r->lse);
    if (!st.ok()) return st;
    DeviceBuffer<float> d_lat(d_lattice);
    DeviceValues d_enc(c.encoder.size(), dtype), d_pred(c.predictor.size(), dtype);
    DeviceValues d_kernel(c.kernel.size(), dtype), d_bias(c.bias.size(), dtype);
    JointBackwardArgs g;
    g.in = in;
    g.workspace = workspace.ptr;
    g.lse = lse.ptr;
    g.d_lattice = d_lat.ptr;
    g.saved_hidden = f.saved_hidden;
    g.saved_logits = f.saved_logits;
    g.d_encoder = d_enc.ptr();
    g.d_predictor = d_pred.ptr();
    g.d_kernel = d_kernel.ptr();
    g.d_bias = d_bias.ptr();
    st = finish(joint_backward_cuda(s, c.options, g, nullptr));
    d_enc.to_host(&r->d_encoder);
    d_pred.to_host(&r->d_predictor);
    d_kernel.to_host(&r->d_kernel);
    d_bias.to_host(&r->d_bias);
    return st;
  }

  const char* fused_unavailable(const JointCase& c) override {
    return fused::unsupported_reason(c.shape, c.options);
  }

  Status upload(const std::vector<std::vector<int32_t>>& sources,
                std::vector<std::vector<int32_t>>* device_copies) override {
    cudaStream_t stream = nullptr;
    Status st = cuda_status(cudaStreamCreate(&stream));
    if (!st.ok()) return st;
    // Work queued ahead of the copies: the stream runs nothing else for 20 ms.
    st = cuda_status(cudaLaunchHostFunc(
        stream, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); },
        nullptr));
    std::vector<std::unique_ptr<DeviceBuffer<int32_t>>> copies;
    for (const std::vector<int32_t>& source : sources) {
      copies.emplace_back(new DeviceBuffer<int32_t>(source.size()));
      std::vector<int32_t> host = source;
      if (st.ok()) {
        st = upload_cuda(copies.back()->ptr, host.data(), host.size() * sizeof(int32_t), stream);
      }
      std::fill(host.begin(), host.end(), -7);
    }
    if (st.ok()) st = cuda_status(cudaStreamSynchronize(stream));
    cudaStreamDestroy(stream);
    device_copies->clear();
    for (const auto& copy : copies) {
      device_copies->emplace_back();
      copy->to_host(&device_copies->back());
    }
    return finish(st);
  }
};

// Loads cuBLAS into the process (globally, so the library's loader finds it already loaded).
bool load_cublas(std::string* why) {
  const char* path = std::getenv("TF_RNNT_CUBLAS");
  if (path && *path) {
    if (dlopen(path, RTLD_NOW | RTLD_GLOBAL)) return true;
    *why = std::string("TF_RNNT_CUBLAS=") + path + " could not be loaded: " + dlerror();
    return false;
  }
  for (const char* name :
       {"libcublas.so.12", "libcublas.so.13", "libcublas.so.11", "libcublas.so"}) {
    if (dlopen(name, RTLD_NOW | RTLD_GLOBAL)) return true;
  }
  *why = "no libcublas on the library search path; set TF_RNNT_CUBLAS to its full path";
  return false;
}

}  // namespace

Backend* gpu_backend(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    *why = err != cudaSuccess ? std::string("no usable CUDA device: ") + cudaGetErrorName(err)
                              : std::string("no CUDA device");
    return nullptr;
  }
  if (!load_cublas(why)) return nullptr;
  static GpuBackend backend;
  return &backend;
}

}  // namespace test
}  // namespace tf_rnnt
