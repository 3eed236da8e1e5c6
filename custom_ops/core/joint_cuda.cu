// CUDA fused joint ("Flash RNN-T"). Per tile of packed lattice nodes:
//   forward:  z = act(enc + pred) -> logits = z @ kernel (cuBLAS, tensor cores) -> online
//             log-sum-exp of logits + bias and the blank/label picks (one warp per node);
//   backward: recompute z and logits (tiled mode), d logits from the two per-node gradients in
//             place, [d kernel; d bias] += [z, 1]^T @ d logits and d hidden = d logits @ kernel^T
//             (cuBLAS; d hidden over z's buffer), then one pass over d hidden * act'(enc + pred)
//             that completes d encoder and leaves per-chunk d predictor sums, and their sum
//             (ordered reductions, no atomics: deterministic).
// z rows are Hz = hidden_width(s) wide: H activations, a ones column (its d kernel row is
// d bias), zeros; the GEMMs over H use Hk = H rounded up to 8 columns, so the ones column costs
// only the d kernel GEMM an extra row. The logits GEMMs read the output layer transposed, and the
// backward's recompute forms z transposed: every GEMM operand is then K-major but the d kernel
// GEMM's d logits.
// Tiled mode keeps the logits tile in the input dtype (float32 accumulation, then rounded, as a
// Keras mixed-precision Dense layer does); the log-sum-exp and the lattice stay float32.
// With JointKernel::kFused (joint_fused.h), tiled mode runs the fused tile kernels instead: the
// forward pass in one launch over all nodes, and per backward tile the recompute with d logits,
// which replaces the first three steps above (and, for a vocabulary ending in a chunk of at most
// 8 columns, sums those columns' d kernel and d bias on chip: the d kernel GEMM then covers whole
// chunks).
// A call runs one of three paths (with_path), each owning its forward and its backward steps:
// CublasRecompute, FusedRecompute and Untiled (kept values). Files: joint_cublas_kernels.cuh
// (the cuBLAS path's kernels), joint_workspace.cuh (workspace and tile plan) and this one.
#include "joint_workspace.cuh"

namespace tf_rnnt {

namespace {

// What every step of a pass reads: the call's sizes and options, its buffers, the cuBLAS handle
// and the stream.
template <typename T>
struct Pass {
  const JointShape& s;
  const JointOptions& o;
  const JointInputs& in;
  const JointBuffers<T>& buf;
  cublasHandle_t handle;
  cudaStream_t stream;
  int H, V, Hz, Hk, Vp;

  Pass(const JointShape& s_, const JointOptions& o_, const JointInputs& in_,
       const JointBuffers<T>& buf_, cublasHandle_t handle_, cudaStream_t stream_)
      : s(s_),
        o(o_),
        in(in_),
        buf(buf_),
        handle(handle_),
        stream(stream_),
        H(s_.H),
        V(s_.V),
        Hz(hidden_width(s_)),
        Hk(round_up_to_8(s_.H)),
        Vp(buf_.Vp) {}

  const T* encoder() const { return static_cast<const T*>(in.encoder); }
  const T* predictor() const { return static_cast<const T*>(in.predictor); }
  void node_offsets() const {
    node_offsets_kernel<<<1, 1, 0, stream>>>(in.logit_lengths, in.label_lengths, s.B, buf.offsets);
  }
};

// A backward tile's GEMM operands: z [rows, Hz] (z_ld 0) or z^T [Hz, z_ld], d logits [rows, Vp],
// and where d hidden goes (over z).
template <typename T>
struct TileGrads {
  const T* z = nullptr;
  int z_ld = 0;
  T* d_logits = nullptr;
  T* d_hidden = nullptr;
};

// The cuBLAS path's forward over tiles of `tile` nodes: z, logits = z @ kernel (L: T, or float32
// where untiled mode keeps them), the picks.
template <typename T, typename L>
Status cublas_forward(const Pass<T>& c, const JointForwardArgs& a, int64_t tile, T* z_buffer,
                      L* logits_buffer) {
  const HostPlan& host = c.in.host;
  padded_kernel_kernel<T><<<blocks_for(static_cast<int64_t>(c.Hk) * c.Vp, 256), 256, 0, c.stream>>>(
      static_cast<const T*>(c.in.kernel), c.H, c.V, c.Hk, c.Vp, true, 0, c.buf.kernel_t);
  padded_bias_kernel<T><<<blocks_for(c.Vp, 256), 256, 0, c.stream>>>(
      static_cast<const T*>(c.in.bias), c.V, c.Vp, 0, c.buf.bias);
  c.node_offsets();
  for (int64_t n0 = 0; n0 < host.num_nodes; n0 += tile) {
    const int64_t rows = std::min(tile, host.num_nodes - n0);
    hidden_kernel<T><<<grid_warps(rows), 32 * kWarps, 0, c.stream>>>(
        n0, rows, c.encoder(), c.predictor(), c.buf.offsets, c.in.label_lengths, c.s.B, c.s.T,
        c.s.U1, c.H, c.Hz, c.o.activation, z_buffer);
    RETURN_IF_ERROR(gemm_row_major(c.handle, false, true, static_cast<int>(rows), c.Vp, c.Hk,
                                   z_buffer, cuda_type<T>(), c.Hz, c.buf.kernel_t, cuda_type<T>(),
                                   c.Hk, 0.f, logits_buffer, cuda_type<L>(), c.Vp, c.o.allow_tf32));
    picks_kernel<L><<<grid_warps(rows), 32 * kWarps, 0, c.stream>>>(
        n0, rows, logits_buffer, c.buf.bias, c.in.labels, c.buf.offsets, c.in.label_lengths, c.s.B,
        c.s.T, c.s.U1, c.Vp, token_columns(c.s), c.s.D, c.o.blank, a.lattice, a.lse);
    RETURN_IF_ERROR(last_launch_status());
  }
  return Status();
}

// The fused forward over every node in one launch (the kernels keep no tile buffer); with
// z_out and logits_out, also keeping the joint values and the logits rounded to T.
template <typename T>
Status fused_forward(const Pass<T>& c, const JointForwardArgs& a, void* z_out, void* logits_out) {
  c.node_offsets();
  RETURN_IF_ERROR(fused::prepare(c.s, c.o, c.in.kernel, c.in.bias, c.buf.fused_kernel,
                                 c.buf.fused_bias, c.stream));
  return fused::forward(c.s, c.o, fused_tile(c.in, c.buf, 0, c.in.host.num_nodes), a.lattice, a.lse,
                        c.stream, z_out, c.Hz, logits_out, c.Vp);
}

// The three ways a call runs the joint, one chosen per call (with_path). Each owns its forward
// and the backward's own steps: prepare (before the shared padding), the step between tiles,
// the tile's GEMM operands, the vocabulary's tail columns summed on chip and their d kernel.

// Tiled, the cuBLAS path: the backward recomputes each tile (activation checkpointing).
template <typename T>
struct CublasRecompute {
  bool fused_layout() const { return false; }  // logits in column order
  Status forward(const Pass<T>& c, const JointForwardArgs& a) const {
    return cublas_forward<T, T>(c, a, c.in.host.tile_nodes, c.buf.tile_z, c.buf.tile_logits);
  }
  int64_t backward_tile(const Pass<T>& c) const { return c.in.host.tile_nodes; }
  int tail(const Pass<T>&) const { return 0; }
  Status prepare(const Pass<T>& c, int64_t /*tail_floats*/) const {
    padded_kernel_kernel<T>
        <<<blocks_for(static_cast<int64_t>(c.Hk) * c.Vp, 256), 256, 0, c.stream>>>(
            static_cast<const T*>(c.in.kernel), c.H, c.V, c.Hk, c.Vp, true, 0, c.buf.kernel_t);
    return Status();
  }
  // z transposed, the logits by cuBLAS, d logits over them.
  Status tile_grads(const Pass<T>& c, const JointBackwardArgs& a, int64_t n0, int64_t rows,
                    TileGrads<T>* g) const {
    // The GEMMs that run along the nodes take z_ld of them, a multiple of 8 (an unaligned count
    // sends cuBLAS to far slower kernels); the padding nodes' z and logits are zero.
    const int z_ld = round_up_to_8(static_cast<int>(rows));
    if constexpr (sizeof(T) == sizeof(float)) {
      hidden_t_shared_kernel<T>
          <<<static_cast<unsigned>((z_ld + kTransposeTile - 1) / kTransposeTile),
             dim3(kTransposeTile, kTransposeRows), 0, c.stream>>>(
              n0, rows, c.encoder(), c.predictor(), c.buf.offsets, c.in.label_lengths, c.s.B, c.s.T,
              c.s.U1, c.H, c.Hz, c.o.activation, z_ld, c.buf.tile_z);
    } else {
      hidden_t_kernel<T>
          <<<static_cast<unsigned>((z_ld + kTransposeThreads - 1) / kTransposeThreads),
             kTransposeThreads, 0, c.stream>>>(n0, rows, c.encoder(), c.predictor(), c.buf.offsets,
                                               c.in.label_lengths, c.s.B, c.s.T, c.s.U1, c.H, c.Hz,
                                               c.o.activation, z_ld, c.buf.tile_z);
    }
    T* logits = c.buf.tile_logits;
    RETURN_IF_ERROR(gemm_row_major(c.handle, true, true, z_ld, c.Vp, c.Hk, c.buf.tile_z,
                                   cuda_type<T>(), z_ld, c.buf.kernel_t, cuda_type<T>(), c.Hk, 0.f,
                                   logits, cuda_type<T>(), c.Vp, c.o.allow_tf32));
    logit_grads_kernel<T, T><<<grid_warps(rows), 32 * kWarps, 0, c.stream>>>(
        n0, rows, logits, c.buf.bias, c.in.labels, c.buf.offsets, c.in.label_lengths, c.s.B, c.s.T,
        c.s.U1, c.V, c.Vp, token_columns(c.s), 0, c.o.blank, a.lse, a.d_lattice, logits);
    *g = TileGrads<T>{c.buf.tile_z, z_ld, logits, c.buf.tile_z};
    return Status();
  }
};

// Tiled, the fused kernels: the forward over every node, per backward tile the recompute of z
// and d logits (the logits stay on chip), whole waves of it a tile.
template <typename T>
struct FusedRecompute {
  bool fused_layout() const { return true; }  // the fused kernels' column order
  Status forward(const Pass<T>& c, const JointForwardArgs& a) const {
    return fused_forward(c, a, nullptr, nullptr);
  }
  // The buffers hold host.tile_nodes; the recompute steps by whole waves.
  int64_t backward_tile(const Pass<T>& c) const {
    return fused::wave_tile(c.s, c.o, c.in.host.tile_nodes);
  }
  // Vocabulary columns the recompute sums on chip, past the d kernel GEMM's.
  int tail(const Pass<T>& c) const { return fused::tail_columns(c.s); }
  Status prepare(const Pass<T>& c, int64_t tail_floats) const {
    RETURN_IF_ERROR(fused::prepare(c.s, c.o, c.in.kernel, c.in.bias, c.buf.fused_kernel,
                                   c.buf.fused_bias, c.stream));
    if (tail_floats > 0) {
      RETURN_IF_ERROR(
          cuda_status(cudaMemsetAsync(c.buf.tail_sums, 0, sizeof(float) * tail_floats, c.stream)));
    }
    // The d logits columns past the recompute's, which the d hidden GEMM sums over: zeros.
    const int written = logits_width(c.s);
    if (c.Vp > written) {
      RETURN_IF_ERROR(cuda_status(cudaMemset2DAsync(
          c.buf.tile_logits + written, sizeof(T) * c.Vp, 0, sizeof(T) * (c.Vp - written),
          static_cast<size_t>((c.in.host.tile_nodes + 7) / 8 * 8), c.stream)));
    }
    return Status();
  }
  Status tile_grads(const Pass<T>& c, const JointBackwardArgs& a, int64_t n0, int64_t rows,
                    TileGrads<T>* g) const {
    RETURN_IF_ERROR(fused::recompute(c.s, c.o, fused_tile(c.in, c.buf, n0, rows), a.lse,
                                     a.d_lattice, c.buf.tile_z, c.Hz, c.buf.tile_logits, c.Vp,
                                     c.buf.tail_sums, c.stream));
    *g = TileGrads<T>{c.buf.tile_z, 0, c.buf.tile_logits, c.buf.tile_z};
    return Status();
  }
};

// Untiled: the forward keeps the joint values and the logits (the fused forward where it
// applies, in T and its column order; else the cuBLAS path, float32), the backward turns them
// into d logits in one tile of every node.
template <typename T>
struct Untiled {
  bool on_chip;  // the fused forward kept them
  bool fused_layout() const { return on_chip; }
  Status forward(const Pass<T>& c, const JointForwardArgs& a) const {
    if (on_chip) return fused_forward(c, a, a.saved_hidden, a.saved_logits);
    return cublas_forward<T, float>(c, a, c.in.host.num_nodes, static_cast<T*>(a.saved_hidden),
                                    a.saved_logits);
  }
  int64_t backward_tile(const Pass<T>& c) const { return c.in.host.num_nodes; }
  int tail(const Pass<T>&) const { return 0; }
  Status prepare(const Pass<T>&, int64_t) const { return Status(); }
  Status tile_grads(const Pass<T>& c, const JointBackwardArgs& a, int64_t n0, int64_t rows,
                    TileGrads<T>* g) const {
    T* z = static_cast<T*>(a.saved_hidden);
    if (on_chip) {  // d logits over the kept T logits
      T* d_logits = reinterpret_cast<T*>(a.saved_logits);
      logit_grads_kernel<T, T><<<grid_warps(rows), 32 * kWarps, 0, c.stream>>>(
          n0, rows, d_logits, c.buf.bias, c.in.labels, c.buf.offsets, c.in.label_lengths, c.s.B,
          c.s.T, c.s.U1, c.V, c.Vp, c.V, fused::permuted_columns(c.V), c.o.blank, a.lse,
          a.d_lattice, d_logits);
      *g = TileGrads<T>{z, 0, d_logits, z};
      return Status();
    }
    // d logits over the float32 logits for float32 T, else in their own buffer.
    T* d_logits =
        sizeof(T) == sizeof(float) ? reinterpret_cast<T*>(a.saved_logits) : c.buf.d_logits;
    logit_grads_kernel<float, T><<<grid_warps(rows), 32 * kWarps, 0, c.stream>>>(
        n0, rows, a.saved_logits, c.buf.bias, c.in.labels, c.buf.offsets, c.in.label_lengths, c.s.B,
        c.s.T, c.s.U1, c.V, c.Vp, token_columns(c.s), 0, c.o.blank, a.lse, a.d_lattice, d_logits);
    *g = TileGrads<T>{z, 0, d_logits, z};
    return Status();
  }
};

// fn(path) with the call's path: untiled mode keeps values, else the fused kernels where the
// options and the device take them (use_fused), else the cuBLAS path.
template <typename T, typename Fn>
Status with_path(const JointShape& s, const JointOptions& o, bool untiled, Fn&& fn) {
  bool on_chip = false;
  RETURN_IF_ERROR(use_fused(s, o, &on_chip));
  if (untiled) return fn(Untiled<T>{on_chip});
  if (on_chip) return fn(FusedRecompute<T>{});
  return fn(CublasRecompute<T>{});
}

template <typename T>
Status forward(const JointShape& s, const JointOptions& o, const JointForwardArgs& a,
               cudaStream_t stream) {
  const HostPlan& host = a.in.host;
  RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(
      a.lattice, 0, sizeof(float) * lattice_channels(s) * static_cast<size_t>(s.B) * s.T * s.U1,
      stream)));
  if (host.num_nodes == 0) return Status();
  cublasHandle_t handle;
  RETURN_IF_ERROR(cublas_handle_for(stream, &handle));
  const bool untiled = a.saved_logits != nullptr;
  const JointBuffers<T> buf(a.workspace, s, o, untiled ? host.num_nodes : host.tile_nodes, false,
                            untiled);
  const Pass<T> c(s, o, a.in, buf, handle, stream);
  return with_path<T>(s, o, untiled, [&](const auto& path) { return path.forward(c, a); });
}

// The backward's steps every path shares around its own (the Path above), into acc.
template <typename T, typename Path>
Status accumulate_grads(const Pass<T>& c, const Path& path, const JointBackwardArgs& a,
                        const GradAccumulators& acc) {
  const HostPlan& host = c.in.host;
  const int H = c.H, V = c.V, Vp = c.Vp, Hz = c.Hz, Hk = c.Hk;
  const cudaStream_t stream = c.stream;
  const JointBuffers<T>& buf = c.buf;
  const int64_t tile = path.backward_tile(c);
  const int tail = path.tail(c);
  const int V0 = V - tail;
  const int64_t tail_floats = tail > 0 ? fused::tail_sum_floats(c.s, tile) : 0;
  RETURN_IF_ERROR(path.prepare(c, tail_floats));
  // The fused kernels' logits and d logits columns, as they store them.
  const int permuted = path.fused_layout() ? fused::permuted_columns(V) : 0;
  padded_kernel_kernel<T><<<blocks_for(static_cast<int64_t>(Hk) * Vp, 256), 256, 0, stream>>>(
      static_cast<const T*>(c.in.kernel), H, V, Hk, Vp, false, permuted, buf.kernel);
  padded_bias_kernel<T><<<blocks_for(Vp, 256), 256, 0, stream>>>(static_cast<const T*>(c.in.bias),
                                                                 V, Vp, permuted, buf.bias);
  c.node_offsets();
  RETURN_IF_ERROR(cuda_status(
      cudaMemsetAsync(buf.d_kernel, 0, sizeof(float) * static_cast<size_t>(Hz) * Vp, stream)));
  const int h_threads = H >= 128 ? 128 : std::max(32, (H + 31) / 32 * 32);
  const int h_slices = (H + h_threads - 1) / h_threads;
  for (int64_t n0 = 0; n0 < host.num_nodes; n0 += tile) {
    const int64_t rows = std::min(tile, host.num_nodes - n0);
    TileGrads<T> g;
    RETURN_IF_ERROR(path.tile_grads(c, a, n0, rows, &g));
    // [d kernel; d bias] += [z, 1]^T @ d logits (ordered over tiles). In 16-bit dtypes cuBLAS
    // runs whole chunks of 128 columns far faster than a few more (not in TF32): after the fused
    // recompute with a tail, the columns up to V0 (it sums the tail's itself); otherwise the
    // whole chunks, then the rest in a second GEMM.
    const int whole = fused::permuted_columns(V);
    const int split = sizeof(T) == 2 && tail == 0 && whole > 0 && whole < V ? whole : 0;
    const auto d_kernel_gemm = [&](int c0, int c1) {
      return gemm_row_major(c.handle, g.z_ld == 0, false, Hz, c1 - c0,
                            g.z_ld ? g.z_ld : static_cast<int>(rows), g.z, cuda_type<T>(),
                            g.z_ld ? g.z_ld : Hz, g.d_logits + c0, cuda_type<T>(), Vp, 1.f,
                            buf.d_kernel + c0, CUDA_R_32F, Vp, c.o.allow_tf32);
    };
    RETURN_IF_ERROR(d_kernel_gemm(0, tail > 0 ? V0 : split > 0 ? split : Vp));
    if (split > 0) RETURN_IF_ERROR(d_kernel_gemm(split, Vp));
    // d hidden = d logits @ Kp^T, over z's buffer (z is not needed any more).
    RETURN_IF_ERROR(gemm_row_major(c.handle, false, true, static_cast<int>(rows), Hk, Vp,
                                   g.d_logits, cuda_type<T>(), Vp, buf.kernel, cuda_type<T>(), Vp,
                                   0.f, g.d_hidden, cuda_type<T>(), Hz, c.o.allow_tf32));
    const TilePlan tp = plan_tile(n0, rows, host, c.s.B);
    // Two 16-bit columns per 4-byte access where H allows it.
    constexpr int kPair = sizeof(T) == 2 ? 2 : 1;
    const bool paired = kPair == 2 && H % 2 == 0;
    const int columns = 32 * (paired ? kPair : 1);
    const dim3 grid(static_cast<unsigned>(tp.chunks), (H + columns - 1) / columns);
    auto hidden_grads = paired ? hidden_grads_kernel<T, kPair> : hidden_grads_kernel<T, 1>;
    if (H > 0) {  // H = 0: d encoder and d predictor are empty (and a zero grid is invalid)
      hidden_grads<<<grid, 32 * kGradWarps, 0, stream>>>(
          n0, rows, tp.span, g.d_hidden, c.encoder(), c.predictor(), buf.offsets,
          c.in.logit_lengths, c.in.label_lengths, c.s.T, c.s.U1, H, Hz, c.o.activation,
          acc.d_encoder, buf.partials);
      predictor_grad_kernel<<<dim3(static_cast<unsigned>(tp.label_pairs), h_slices), h_threads, 0,
                              stream>>>(tp.span, buf.partials, c.in.logit_lengths,
                                        c.in.label_lengths, c.s.U1, H, acc.d_predictor);
    }
    RETURN_IF_ERROR(last_launch_status());
  }
  if (tail > 0) {
    const int64_t slots = tail_floats / (static_cast<int64_t>(tail) * (H + 1));
    tail_grad_kernel<<<dim3((H + 32) / 32, tail), 32 * kTailLanes, 0, stream>>>(
        buf.tail_sums, slots, tail, H, V0, Vp, buf.d_kernel);
  }
  unpad_grad_kernel<<<blocks_for(static_cast<int64_t>(H + 1) * V, 256), 256, 0, stream>>>(
      buf.d_kernel, H, V, Vp, permuted, acc.d_kernel, acc.d_bias);
  return last_launch_status();
}

template <typename T>
Status backward(const JointShape& s, const JointOptions& o, const JointBackwardArgs& a,
                cudaStream_t stream) {
  const HostPlan& host = a.in.host;
  const bool untiled = a.saved_logits != nullptr;
  const JointBuffers<T> buf(a.workspace, s, o, untiled ? host.num_nodes : host.tile_nodes, true,
                            untiled);
  constexpr bool kFloat = std::is_same<T, float>::value;
  const GradAccumulators acc = kFloat ? GradAccumulators::of_outputs(a) : buf.acc;
  const GradSizes sizes(s);
  float* const from[4] = {acc.d_encoder, acc.d_predictor, acc.d_kernel, acc.d_bias};
  const int64_t count[4] = {sizes.encoder, sizes.predictor, sizes.kernel, sizes.bias};
  for (int k = 0; k < 4; ++k) {  // zeroed, then accumulated
    RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(from[k], 0, sizeof(float) * count[k], stream)));
  }
  if (host.num_nodes > 0) {
    cublasHandle_t handle;
    RETURN_IF_ERROR(cublas_handle_for(stream, &handle));
    const Pass<T> c(s, o, a.in, buf, handle, stream);
    RETURN_IF_ERROR(with_path<T>(
        s, o, untiled, [&](const auto& path) { return accumulate_grads(c, path, a, acc); }));
  }
  if (kFloat) return Status();
  // The gradients in T, from their float32 accumulators.
  void* to[4] = {a.d_encoder, a.d_predictor, a.d_kernel, a.d_bias};
  for (int k = 0; k < 4; ++k) {
    if (count[k] == 0) continue;
    cast_kernel<T>
        <<<blocks_for(count[k], 256), 256, 0, stream>>>(from[k], static_cast<T*>(to[k]), count[k]);
  }
  return last_launch_status();
}

}  // namespace

size_t joint_workspace_bytes_cuda(const JointShape& s, const JointOptions& options,
                                  int64_t tile_nodes, bool backward, bool untiled) {
  size_t bytes = 0;
  dispatch_dtype_cuda(options.dtype, [&](auto tag) {
    bytes = JointBuffers<decltype(tag)>(nullptr, s, options, static_cast<size_t>(tile_nodes),
                                        backward, untiled)
                .bytes;
  });
  return bytes;
}

JointSavedSizes joint_saved_sizes_cuda(const JointShape& shape, const JointOptions& options,
                                       int64_t num_nodes) {
  JointSavedSizes sizes;
  sizes.hidden = num_nodes * hidden_width(shape);
  if (fused_pass(shape, options)) {  // the fused forward's rounded logits, in float32 elements
    const int64_t bytes = num_nodes * pass_logits_width(shape, true) * dtype_size(options.dtype);
    sizes.logits = (bytes + 3) / 4;
  } else {
    sizes.logits = num_nodes * logits_width(shape);
  }
  return sizes;
}

Status copy_cuda(void* dst, const void* src, size_t bytes, GpuStream stream) {
  return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                     static_cast<cudaStream_t>(stream)));
}

// run(T()) for the dtype T.
template <typename Run>
Status dispatch_pass(const JointOptions& options, Run&& run) {
  Status status;
  dispatch_dtype_cuda(options.dtype, [&](auto tag) { status = run(tag); });
  return status;
}

Status joint_forward_cuda(const JointShape& shape, const JointOptions& options,
                          const JointForwardArgs& args, GpuStream stream) {
  return dispatch_pass(options, [&](auto t) {
    return forward<decltype(t)>(shape, options, args, static_cast<cudaStream_t>(stream));
  });
}

Status joint_backward_cuda(const JointShape& shape, const JointOptions& options,
                           const JointBackwardArgs& args, GpuStream stream) {
  return dispatch_pass(options, [&](auto t) {
    return backward<decltype(t)>(shape, options, args, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace tf_rnnt
