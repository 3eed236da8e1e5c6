// CPU fused joint ("Flash RNN-T"): joint + output layer + log-softmax picks, tile by tile.
// GEMMs use Eigen's single-threaded kernels on shards that each thread owns, so results are
// deterministic and no thread writes another's output.
#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <vector>

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
  const int32_t* label_lengths;
  const Storage* encoder;
  const Storage* predictor;
  const int32_t* labels;
  const int64_t* offsets;
  std::vector<float> kernel;  // [H, V] float32
  std::vector<float> bias;    // [V]

  JointCpu(const JointShape& shape, const int32_t* label_lengths_, const void* enc,
           const void* pred, const void* kern, const void* b, const int32_t* labels_,
           const int64_t* offsets_)
      : s(shape),
        label_lengths(label_lengths_),
        encoder(static_cast<const Storage*>(enc)),
        predictor(static_cast<const Storage*>(pred)),
        labels(labels_),
        offsets(offsets_),
        kernel(to_float_vector<Load>(kern, static_cast<int64_t>(shape.H) * shape.V)),
        bias(to_float_vector<Load>(b, shape.V)) {}

  // z = act(encoder[b, t] + predictor[b, u]) for nodes [n0, n1), rounded to the input dtype.
  void hidden(int64_t n0, int64_t n1, float* z) const {
    const int H = s.H;
    NodeCursor cursor(n0, offsets, s.B, label_lengths);
    for (int64_t n = n0; n < n1; ++n, cursor.next()) {
      const NodeIndex& i = cursor.idx;
      const Storage* e = encoder + (static_cast<int64_t>(i.b) * s.T + i.t) * H;
      const Storage* p = predictor + (static_cast<int64_t>(i.b) * s.U1 + i.u) * H;
      float* out = z + (n - n0) * H;
      for (int h = 0; h < H; ++h) {
        out[h] = round_to_dtype<Load>(
            activate(Load::to_float(e[h]) + Load::to_float(p[h]), s.activation));
      }
    }
  }

  // logits = z @ kernel (bias is added where the logits are read).
  void logits(int64_t rows, const float* z, float* out) const {
    ConstMatrixMap zm(z, rows, s.H);
    ConstMatrixMap km(kernel.data(), s.H, s.V);
    MatrixMap om(out, rows, s.V);
    om.noalias() = zm * km;
  }

  // Online log-sum-exp and the two picks of nodes [n0, n1) into the padded lattice.
  void picks(int64_t n0, int64_t n1, const float* logits, float* lattice, float* lse) const {
    const int V = s.V;
    NodeCursor cursor(n0, offsets, s.B, label_lengths);
    for (int64_t n = n0; n < n1; ++n, cursor.next()) {
      const NodeIndex& i = cursor.idx;
      const float* row = logits + (n - n0) * V;
      LseState st = lse_init();
      for (int v = 0; v < V; ++v) st = lse_push(st, row[v] + bias[v]);
      const float total = lse_value(st);
      const int64_t padded = (static_cast<int64_t>(i.b) * s.T + i.t) * s.U1 + i.u;
      lse[n] = total;
      lattice[2 * padded] = log_softmax_at(row[s.blank] + bias[s.blank], st);
      if (i.u < label_lengths[i.b]) {
        const int label = labels[static_cast<int64_t>(i.b) * (s.U1 - 1) + i.u];
        lattice[2 * padded + 1] = log_softmax_at(row[label] + bias[label], st);
      }
    }
  }

  // logits rows -> d logits in place (eq. for logit_grad), rounded to the input dtype.
  void logit_grads(int64_t n0, int64_t n1, const float* lse, const float* d_lattice,
                   float* rows) const {
    const int V = s.V;
    NodeCursor cursor(n0, offsets, s.B, label_lengths);
    for (int64_t n = n0; n < n1; ++n, cursor.next()) {
      const NodeIndex& i = cursor.idx;
      const int64_t padded = (static_cast<int64_t>(i.b) * s.T + i.t) * s.U1 + i.u;
      const bool has_label = i.u < label_lengths[i.b];
      const int label = has_label ? labels[static_cast<int64_t>(i.b) * (s.U1 - 1) + i.u] : -1;
      const float g_blank = d_lattice[2 * padded];
      const float g_label = has_label ? d_lattice[2 * padded + 1] : 0.f;
      float* row = rows + (n - n0) * V;
      for (int v = 0; v < V; ++v) {
        row[v] = round_to_dtype<Load>(
            logit_grad(row[v] + bias[v], lse[n], v, s.blank, label, g_blank, g_label));
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

}  // namespace

void joint_node_offsets(const int32_t* logit_lengths, const int32_t* label_lengths, int B,
                        int64_t* offsets) {
  offsets[0] = 0;
  for (int b = 0; b < B; ++b) {
    offsets[b + 1] = offsets[b] + static_cast<int64_t>(logit_lengths[b]) * (label_lengths[b] + 1);
  }
}

Status joint_forward_cpu(const JointShape& shape, const JointForwardArgs& a,
                         const ParallelFor& parallel_for) {
  const int H = shape.H, V = shape.V;
  std::memset(a.lattice, 0, sizeof(float) * 2 * shape.B * static_cast<int64_t>(shape.T) * shape.U1);
  if (a.num_nodes == 0) return Status();
  const bool untiled = a.saved_logits != nullptr;
  const int64_t tile = untiled ? a.num_nodes : a.tile_nodes;
  WorkerFailure failure;
  dispatch_dtype(shape.dtype, [&](auto load) {
    using Load = decltype(load);
    JointCpu<Load> joint(shape, a.label_lengths, a.encoder, a.predictor, a.kernel, a.bias, a.labels,
                         a.node_offsets);
    float* z = static_cast<float*>(a.workspace);
    float* logits = untiled ? a.saved_logits : z + tile * H;
    for (int64_t n0 = 0; n0 < a.num_nodes; n0 += tile) {
      const int64_t rows = std::min(tile, a.num_nodes - n0);
      parallel_for(shards(rows), kRowsPerShard * H * V * 2, failure.guard([&](int64_t s0, int64_t s1) {
        const int64_t r0 = s0 * kRowsPerShard, r1 = std::min(rows, s1 * kRowsPerShard);
        joint.hidden(n0 + r0, n0 + r1, z + r0 * H);
        joint.logits(r1 - r0, z + r0 * H, logits + (n0 + r0 - (untiled ? 0 : n0)) * V);
        joint.picks(n0 + r0, n0 + r1, logits + (n0 + r0 - (untiled ? 0 : n0)) * V, a.lattice,
                    a.lse);
        if (untiled) {
          auto* saved = static_cast<typename Load::Storage*>(a.saved_hidden);
          for (int64_t i = r0 * H; i < r1 * H; ++i) saved[n0 * H + i] = Load::from_float(z[i]);
        }
      }));
    }
  });
  return failure.status();
}

Status joint_backward_cpu(const JointShape& shape, const JointBackwardArgs& a,
                          const ParallelFor& parallel_for) {
  const int H = shape.H, V = shape.V;
  std::memset(a.d_encoder, 0, sizeof(float) * shape.B * static_cast<int64_t>(shape.T) * H);
  std::memset(a.d_predictor, 0, sizeof(float) * shape.B * static_cast<int64_t>(shape.U1) * H);
  std::memset(a.d_kernel, 0, sizeof(float) * static_cast<int64_t>(H) * V);
  std::memset(a.d_bias, 0, sizeof(float) * V);
  if (a.num_nodes == 0) return Status();
  const bool untiled = a.saved_logits != nullptr;
  const int64_t tile = untiled ? a.num_nodes : a.tile_nodes;
  WorkerFailure failure;
  dispatch_dtype(shape.dtype, [&](auto load) {
    using Load = decltype(load);
    using Storage = typename Load::Storage;
    JointCpu<Load> joint(shape, a.label_lengths, a.encoder, a.predictor, a.kernel, a.bias, a.labels,
                         a.node_offsets);
    float* z = static_cast<float*>(a.workspace);
    float* d_hidden = z + tile * H;
    float* tile_logits = d_hidden + tile * H;
    ConstMatrixMap kernel(joint.kernel.data(), H, V);
    MatrixMap d_kernel(a.d_kernel, H, V);
    for (int64_t n0 = 0; n0 < a.num_nodes; n0 += tile) {
      const int64_t rows = std::min(tile, a.num_nodes - n0);
      float* logits = untiled ? a.saved_logits + n0 * V : tile_logits;
      // Recompute (tiled) or reload (untiled) the tile's joint values and logits, then form
      // d logits in place and d hidden = d logits @ kernel^T.
      parallel_for(shards(rows), kRowsPerShard * H * V * 6, failure.guard([&](int64_t s0, int64_t s1) {
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
          dh.data()[i - r0 * H] *= activation_grad(z[i], shape.activation);
        }
      }));
      // d kernel += z^T @ d logits and d bias += column sums, sharded over vocabulary columns.
      constexpr int64_t kCols = 64;
      ConstMatrixMap zm(z, rows, H);
      ConstMatrixMap dl(logits, rows, V);
      parallel_for((V + kCols - 1) / kCols, rows * H * kCols * 2, failure.guard([&](int64_t c0, int64_t c1) {
        const int64_t v0 = c0 * kCols, v1 = std::min<int64_t>(V, c1 * kCols);
        d_kernel.middleCols(v0, v1 - v0).noalias() += zm.transpose() * dl.middleCols(v0, v1 - v0);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t v = v0; v < v1; ++v) a.d_bias[v] += logits[r * V + v];
        }
      }));
      // d encoder[b, t] += sum_u d hidden; d predictor[b, u] += sum_t d hidden.
      // Sharded over hidden columns: each thread owns its columns of both outputs.
      constexpr int64_t kHidden = 32;
      parallel_for((H + kHidden - 1) / kHidden, rows * kHidden * 2, [&](int64_t c0, int64_t c1) {
        const int64_t h0 = c0 * kHidden, h1 = std::min<int64_t>(H, c1 * kHidden);
        NodeCursor cursor(n0, a.node_offsets, shape.B, a.label_lengths);
        for (int64_t r = 0; r < rows; ++r, cursor.next()) {
          const NodeIndex& i = cursor.idx;
          float* de = a.d_encoder + (static_cast<int64_t>(i.b) * shape.T + i.t) * H;
          float* dp = a.d_predictor + (static_cast<int64_t>(i.b) * shape.U1 + i.u) * H;
          const float* dh = d_hidden + r * H;
          for (int64_t h = h0; h < h1; ++h) {
            de[h] += dh[h];
            dp[h] += dh[h];
          }
        }
      });
    }
  });
  return failure.status();
}

size_t joint_workspace_bytes_cpu(const JointShape& shape, int64_t tile_nodes, bool backward,
                             bool untiled) {
  // CPU layout: z float [tile, H]; backward adds d hidden float [tile, H]; tiled mode adds the
  // tile's float logits [tile, V] (untiled mode reads/writes saved_logits instead).
  // The GPU launcher (joint_cuda.cu) has its own layout and size function.
  const size_t per_node = sizeof(float) * (shape.H * (backward ? 2 : 1) + (untiled ? 0 : shape.V));
  return per_node * static_cast<size_t>(tile_nodes);
}

}  // namespace tf_rnnt
