// CPU fused joint ("Flash RNN-T"): joint + output layer + log-softmax picks, tile by tile.
// GEMMs use Eigen's single-threaded kernels on shards that each thread owns, so results are
// deterministic and no thread writes another's output.
#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#include "joint_grads.h"
#include "tf_rnnt/dtype_cpu.h"
#include "tf_rnnt/node_math.h"
#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;

// Rounds through the input dtype, as the GPU path stores joint values and d logits in it.
template <typename Load>
float round_to_dtype(float x) {
  return Load::to_float(Load::from_float(x));
}

template <typename Load>
std::vector<float> to_float_vector(const void* data, int64_t n) {
  const auto* in = static_cast<const typename Load::Storage*>(data);
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = Load::to_float(in[i]);
  return out;
}

constexpr int64_t kRowsPerShard = 64;

// Packed node -> (b, t, u) for a run of consecutive nodes, without a search per node.
struct NodeCursor {
  NodeCursor(int64_t n, const int64_t* offsets, int B, const int32_t* label_lengths)
      : B_(B), offsets_(offsets), label_lengths_(label_lengths) {
    idx = locate_node(n, offsets, B, label_lengths);
  }
  void next() {
    if (++idx.u < label_lengths_[idx.b] + 1) return;
    idx.u = 0;
    ++idx.t;
    while (idx.b < B_ &&
           offsets_[idx.b] + static_cast<int64_t>(idx.t) * (label_lengths_[idx.b] + 1) >=
               offsets_[idx.b + 1]) {
      ++idx.b;
      idx.t = 0;
    }
  }
  NodeIndex idx;

 private:
  int B_;
  const int64_t* offsets_;
  const int32_t* label_lengths_;
};

template <typename Load>
struct JointCpu {
  using Storage = typename Load::Storage;
  const JointShape& s;
  const JointOptions& o;
  const int32_t* label_lengths;
  const Storage* encoder;
  const Storage* predictor;
  const int32_t* labels;
  const int64_t* offsets;
  std::vector<float> kernel;  // [H, V] float32
  std::vector<float> bias;    // [V]

  JointCpu(const JointShape& shape, const JointOptions& options, const JointInputs& in)
      : s(shape),
        o(options),
        label_lengths(in.host.label_lengths),
        encoder(static_cast<const Storage*>(in.encoder)),
        predictor(static_cast<const Storage*>(in.predictor)),
        labels(in.labels),
        offsets(in.host.node_offsets),
        kernel(to_float_vector<Load>(in.kernel, static_cast<int64_t>(shape.H) * shape.V)),
        bias(to_float_vector<Load>(in.bias, shape.V)) {}

  // z = act(encoder[b, t] + predictor[b, u]) for nodes [n0, n1), rounded to the input dtype.
  void hidden(int64_t n0, int64_t n1, float* z) const {
    const int H = s.H;
    NodeCursor cursor(n0, offsets, s.B, label_lengths);
    for (int64_t n = n0; n < n1; ++n, cursor.next()) {
      const NodeIndex& i = cursor.idx;
      const Storage* e = encoder + (static_cast<int64_t>(i.b) * s.T + i.t) * H;
      const Storage* p = predictor + (static_cast<int64_t>(i.b) * s.U1 + i.u) * H;
      float* out = z + (n - n0) * H;
      for (int h = 0; h < H; ++h) out[h] = Load::to_float(e[h]) + Load::to_float(p[h]);
      activate_row(out, H);
      if (!std::is_same<Load, LoadFloat32>::value) {
        for (int h = 0; h < H; ++h) out[h] = round_to_dtype<Load>(out[h]);
      }
    }
  }

  // act() of node_math.h over a row, through Eigen's vectorized tanh (the same approximation as
  // TensorFlow's CPU tanh): glibc's scalar tanhf took most of a CPU training step.
  void activate_row(float* row, int H) const {
    Eigen::Map<Eigen::ArrayXf> x(row, H);
    switch (o.activation) {
      case Activation::kTanh:
        x = x.tanh();
        break;
      case Activation::kRelu:
        x = x.max(0.f);
        break;
      default:
        break;
    }
  }

  // logits = z @ kernel (bias is added where the logits are read).
  void logits(int64_t rows, const float* z, float* out) const {
    ConstMatrixMap zm(z, rows, s.H);
    ConstMatrixMap km(kernel.data(), s.H, s.V);
    MatrixMap om(out, rows, s.V);
    om.noalias() = zm * km;
  }

  // Online log-sum-exp over the token columns and the two picks of nodes [n0, n1) into the
  // padded lattice; a TDT joint's duration log-softmax into channels 2 .. 2 + D.
  void picks(int64_t n0, int64_t n1, const float* logits, float* lattice, float* lse) const {
    const int V = s.V, Vt = token_columns(s), C = lattice_channels(s);
    NodeCursor cursor(n0, offsets, s.B, label_lengths);
    for (int64_t n = n0; n < n1; ++n, cursor.next()) {
      const NodeIndex& i = cursor.idx;
      const float* row = logits + (n - n0) * V;
      LseState st = lse_init();
      for (int v = 0; v < Vt; ++v) st = lse_push(st, row[v] + bias[v]);
      const int64_t padded = (static_cast<int64_t>(i.b) * s.T + i.t) * s.U1 + i.u;
      float* node = lattice + C * padded;
      lse[n] = lse_value(st);
      node[0] = log_softmax_at(row[o.blank] + bias[o.blank], st);
      if (i.u < label_lengths[i.b]) {
        const int label = labels[static_cast<int64_t>(i.b) * (s.U1 - 1) + i.u];
        node[1] = log_softmax_at(row[label] + bias[label], st);
      }
      if (s.D == 0) continue;
      const LseState dur = durations_lse(row);
      for (int j = 0; j < s.D; ++j) node[2 + j] = log_softmax_at(row[Vt + j] + bias[Vt + j], dur);
    }
  }

  // Log-sum-exp of a row's duration columns (TDT).
  LseState durations_lse(const float* row) const {
    LseState st = lse_init();
    for (int v = token_columns(s); v < s.V; ++v) st = lse_push(st, row[v] + bias[v]);
    return st;
  }

  // logits rows -> d logits in place (logit_grad; duration_logit_grad for a TDT joint's
  // duration columns), rounded to the input dtype.
  void logit_grads(int64_t n0, int64_t n1, const float* lse, const float* d_lattice,
                   float* rows) const {
    const int V = s.V, Vt = token_columns(s), C = lattice_channels(s);
    NodeCursor cursor(n0, offsets, s.B, label_lengths);
    for (int64_t n = n0; n < n1; ++n, cursor.next()) {
      const NodeIndex& i = cursor.idx;
      const int64_t padded = (static_cast<int64_t>(i.b) * s.T + i.t) * s.U1 + i.u;
      const bool has_label = i.u < label_lengths[i.b];
      const int label = has_label ? labels[static_cast<int64_t>(i.b) * (s.U1 - 1) + i.u] : -1;
      const float* g = d_lattice + C * padded;
      const float g_blank = g[0];
      const float g_label = has_label ? g[1] : 0.f;
      float* row = rows + (n - n0) * V;
      if (s.D > 0) {
        const float dur_lse = lse_value(durations_lse(row));
        float g_sum = 0.f;
        for (int j = 0; j < s.D; ++j) g_sum += g[2 + j];
        for (int j = 0; j < s.D; ++j) {
          const int v = Vt + j;
          row[v] =
              round_to_dtype<Load>(duration_logit_grad(row[v] + bias[v], dur_lse, g[2 + j], g_sum));
        }
      }
      for (int v = 0; v < Vt; ++v) {
        row[v] = round_to_dtype<Load>(
            logit_grad(row[v] + bias[v], lse[n], v, o.blank, label, g_blank, g_label));
      }
    }
  }
};

int64_t shards(int64_t rows) { return (rows + kRowsPerShard - 1) / kRowsPerShard; }

// Eigen's GEMMs allocate blocking buffers; an exception escaping a thread-pool worker would
// terminate the process, so workers record it and the launcher returns ResourceExhausted.
struct WorkerFailure {
  std::atomic<bool> failed{false};
  template <typename Fn>
  std::function<void(int64_t, int64_t)> guard(Fn fn) {
    return [this, fn](int64_t begin, int64_t end) {
      if (failed.load()) return;
      try {
        fn(begin, end);
      } catch (...) {
        failed.store(true);
      }
    };
  }
  Status status() const {
    Status s;
    if (failed.load()) {
      s.code = StatusCode::kResourceExhausted;
      s.message = "out of memory in a CPU GEMM";
    }
    return s;
  }
};

// The workspace's float32 buffers: per tile z [tile, H], d hidden [tile, H] (backward) and, tiled,
// logits [tile, V]; then, backward with 16-bit inputs, the gradient accumulators (float32 inputs
// accumulate in the outputs).
struct CpuBuffers {
  float* z = nullptr;
  float* d_hidden = nullptr;
  float* tile_logits = nullptr;
  GradAccumulators acc;
  size_t floats = 0;

  CpuBuffers(void* base, const JointShape& s, DType dtype, int64_t tile, bool backward,
             bool untiled) {
    float* origin = static_cast<float*>(base);
    auto take = [&](float*& ptr, int64_t count) {
      ptr = origin ? origin + floats : nullptr;
      floats += static_cast<size_t>(count);
    };
    take(z, tile * s.H);
    if (backward) take(d_hidden, tile * s.H);
    if (!untiled) take(tile_logits, tile * s.V);
    if (backward && dtype != DType::kFloat32) {
      take(acc.d_encoder, static_cast<int64_t>(s.B) * s.T * s.H);
      take(acc.d_predictor, static_cast<int64_t>(s.B) * s.U1 * s.H);
      take(acc.d_kernel, static_cast<int64_t>(s.H) * s.V);
      take(acc.d_bias, s.V);
    }
  }
};

}  // namespace

void joint_node_offsets(const int32_t* logit_lengths, const int32_t* label_lengths, int B,
                        int64_t* offsets) {
  offsets[0] = 0;
  for (int b = 0; b < B; ++b) {
    offsets[b + 1] = offsets[b] + static_cast<int64_t>(logit_lengths[b]) * (label_lengths[b] + 1);
  }
}

Status joint_forward_cpu(const JointShape& shape, const JointOptions& options,
                         const JointForwardArgs& a, const ParallelFor& parallel_for) {
  const int H = shape.H, V = shape.V;
  std::memset(
      a.lattice, 0,
      sizeof(float) * lattice_channels(shape) * shape.B * static_cast<int64_t>(shape.T) * shape.U1);
  const int64_t num_nodes = a.in.host.num_nodes;
  if (num_nodes == 0) return Status();
  const bool untiled = a.saved_logits != nullptr;
  const int64_t tile = untiled ? num_nodes : a.in.host.tile_nodes;
  WorkerFailure failure;
  dispatch_dtype(options.dtype, [&](auto load) {
    using Load = decltype(load);
    JointCpu<Load> joint(shape, options, a.in);
    const CpuBuffers buf(a.workspace, shape, options.dtype, tile, false, untiled);
    float* z = buf.z;
    float* logits = untiled ? a.saved_logits : buf.tile_logits;
    for (int64_t n0 = 0; n0 < num_nodes; n0 += tile) {
      const int64_t rows = std::min(tile, num_nodes - n0);
      auto shard = failure.guard([&](int64_t s0, int64_t s1) {
        const int64_t r0 = s0 * kRowsPerShard, r1 = std::min(rows, s1 * kRowsPerShard);
        joint.hidden(n0 + r0, n0 + r1, z + r0 * H);
        joint.logits(r1 - r0, z + r0 * H, logits + (n0 + r0 - (untiled ? 0 : n0)) * V);
        joint.picks(n0 + r0, n0 + r1, logits + (n0 + r0 - (untiled ? 0 : n0)) * V, a.lattice,
                    a.lse);
        if (untiled) {
          auto* saved = static_cast<typename Load::Storage*>(a.saved_hidden);
          for (int64_t i = r0 * H; i < r1 * H; ++i) saved[n0 * H + i] = Load::from_float(z[i]);
        }
      });
      parallel_for(shards(rows), kRowsPerShard * H * V * 2, shard);
    }
  });
  return failure.status();
}

Status joint_backward_cpu(const JointShape& shape, const JointOptions& options,
                          const JointBackwardArgs& a, const ParallelFor& parallel_for) {
  const int H = shape.H, V = shape.V;
  const int64_t num_nodes = a.in.host.num_nodes;
  const bool untiled = a.saved_logits != nullptr;
  const int64_t tile = untiled ? num_nodes : a.in.host.tile_nodes;
  CpuBuffers buf(a.workspace, shape, options.dtype, tile, true, untiled);
  const GradAccumulators acc =
      options.dtype == DType::kFloat32 ? GradAccumulators::of_outputs(a) : buf.acc;
  const GradSizes sizes(shape);
  std::memset(acc.d_encoder, 0, sizeof(float) * sizes.encoder);
  std::memset(acc.d_predictor, 0, sizeof(float) * sizes.predictor);
  std::memset(acc.d_kernel, 0, sizeof(float) * sizes.kernel);
  std::memset(acc.d_bias, 0, sizeof(float) * sizes.bias);
  WorkerFailure failure;
  dispatch_dtype(options.dtype, [&](auto load) {
    using Load = decltype(load);
    using Storage = typename Load::Storage;
    JointCpu<Load> joint(shape, options, a.in);
    float* z = buf.z;
    float* d_hidden = buf.d_hidden;
    float* tile_logits = buf.tile_logits;
    ConstMatrixMap kernel(joint.kernel.data(), H, V);
    MatrixMap d_kernel(acc.d_kernel, H, V);
    for (int64_t n0 = 0; n0 < num_nodes; n0 += tile) {
      const int64_t rows = std::min(tile, num_nodes - n0);
      float* logits = untiled ? a.saved_logits + n0 * V : tile_logits;
      // Recompute (tiled) or reload (untiled) the tile's joint values and logits, then form
      // d logits in place and d hidden = d logits @ kernel^T.
      auto shard = failure.guard([&](int64_t s0, int64_t s1) {
        const int64_t r0 = s0 * kRowsPerShard, r1 = std::min(rows, s1 * kRowsPerShard);
        if (untiled) {
          const auto* saved = static_cast<const Storage*>(a.saved_hidden) + (n0 + r0) * H;
          for (int64_t i = 0; i < (r1 - r0) * H; ++i) z[r0 * H + i] = Load::to_float(saved[i]);
        } else {
          joint.hidden(n0 + r0, n0 + r1, z + r0 * H);
          joint.logits(r1 - r0, z + r0 * H, logits + r0 * V);
        }
        joint.logit_grads(n0 + r0, n0 + r1, a.lse, a.d_lattice, logits + r0 * V);
        ConstMatrixMap dl(logits + r0 * V, r1 - r0, V);
        MatrixMap dh(d_hidden + r0 * H, r1 - r0, H);
        dh.noalias() = dl * kernel.transpose();
        for (int64_t i = r0 * H; i < r1 * H; ++i) {
          dh.data()[i - r0 * H] *= activation_grad(z[i], options.activation);
        }
      });
      parallel_for(shards(rows), kRowsPerShard * H * V * 6, shard);
      // d kernel += z^T @ d logits and d bias += column sums, sharded over vocabulary columns:
      // about 8 shards for a small vocabulary (a fixed function of V, so results do not depend
      // on the thread count), 64 columns each for a large one.
      const int64_t kCols = std::min<int64_t>(64, std::max<int64_t>(8, ((V + 7) / 8 + 7) / 8 * 8));
      ConstMatrixMap zm(z, rows, H);
      ConstMatrixMap dl(logits, rows, V);
      auto columns = failure.guard([&](int64_t c0, int64_t c1) {
        const int64_t v0 = c0 * kCols, v1 = std::min<int64_t>(V, c1 * kCols);
        d_kernel.middleCols(v0, v1 - v0).noalias() += zm.transpose() * dl.middleCols(v0, v1 - v0);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t v = v0; v < v1; ++v) acc.d_bias[v] += logits[r * V + v];
        }
      });
      parallel_for((V + kCols - 1) / kCols, rows * H * kCols * 2, columns);
      // d encoder[b, t] += sum_u d hidden; d predictor[b, u] += sum_t d hidden.
      // Sharded over hidden columns: each thread owns its columns of both outputs.
      constexpr int64_t kHidden = 32;
      parallel_for((H + kHidden - 1) / kHidden, rows * kHidden * 2, [&](int64_t c0, int64_t c1) {
        const int64_t h0 = c0 * kHidden, h1 = std::min<int64_t>(H, c1 * kHidden);
        NodeCursor cursor(n0, a.in.host.node_offsets, shape.B, a.in.host.label_lengths);
        for (int64_t r = 0; r < rows; ++r, cursor.next()) {
          const NodeIndex& i = cursor.idx;
          float* de = acc.d_encoder + (static_cast<int64_t>(i.b) * shape.T + i.t) * H;
          float* dp = acc.d_predictor + (static_cast<int64_t>(i.b) * shape.U1 + i.u) * H;
          const float* dh = d_hidden + r * H;
          for (int64_t h = h0; h < h1; ++h) {
            de[h] += dh[h];
            dp[h] += dh[h];
          }
        }
      });
    }
    if (options.dtype != DType::kFloat32) {
      // The gradients in the input dtype, from their float32 accumulators.
      const float* from[4] = {acc.d_encoder, acc.d_predictor, acc.d_kernel, acc.d_bias};
      void* to[4] = {a.d_encoder, a.d_predictor, a.d_kernel, a.d_bias};
      const int64_t count[4] = {sizes.encoder, sizes.predictor, sizes.kernel, sizes.bias};
      for (int k = 0; k < 4; ++k) {
        auto* out = static_cast<Storage*>(to[k]);
        parallel_for(count[k], 4, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) out[i] = Load::from_float(from[k][i]);
        });
      }
    }
  });
  return failure.status();
}

size_t joint_workspace_bytes_cpu(const JointShape& shape, const JointOptions& options,
                                 int64_t tile_nodes, bool backward, bool untiled) {
  // The GPU launcher (joint_cuda.cu) has its own layout and size function.
  return sizeof(float) *
         CpuBuffers(nullptr, shape, options.dtype, tile_nodes, backward, untiled).floats;
}

JointSavedSizes joint_saved_sizes_cpu(const JointShape& shape, const JointOptions&,
                                      int64_t num_nodes) {
  JointSavedSizes sizes;
  sizes.hidden = num_nodes * shape.H;
  sizes.logits = num_nodes * shape.V;
  return sizes;
}

}  // namespace tf_rnnt
