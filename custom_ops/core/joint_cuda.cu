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
// Files: joint_cublas_kernels.cuh (the cuBLAS path's kernels), joint_workspace.cuh (workspace and
// tile plan) and this one (the passes and the launchers).
#include "joint_workspace.cuh"

namespace tf_rnnt {

namespace {

// L: the logits' dtype (T in tiled mode, float32 when untiled mode keeps them).
template <typename T, typename L>
Status forward(const JointShape& s, const JointOptions& o, const JointForwardArgs& a,
               cudaStream_t stream) {
  const JointInputs& in = a.in;
  const HostPlan& host = in.host;
  const int H = s.H, V = s.V;
  const int Hz = hidden_width(s), Hk = round_up_to_8(H);
  RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(
      a.lattice, 0, sizeof(float) * 2 * static_cast<size_t>(s.B) * s.T * s.U1, stream)));
  if (host.num_nodes == 0) return Status();
  cublasHandle_t handle;
  RETURN_IF_ERROR(cublas_handle_for(stream, &handle));
  const bool untiled = a.saved_logits != nullptr;
  const int64_t tile = untiled ? host.num_nodes : host.tile_nodes;
  const JointBuffers<T> buf(a.workspace, s, o, tile, false, untiled);
  const int Vp = buf.Vp;
  bool on_chip = false;
  RETURN_IF_ERROR(use_fused(s, o, &on_chip));
  if (on_chip) {  // every node in one launch: the kernels keep no tile buffer
    node_offsets_kernel<<<1, 1, 0, stream>>>(in.logit_lengths, in.label_lengths, s.B, buf.offsets);
    RETURN_IF_ERROR(
        fused::prepare(s, o, in.kernel, in.bias, buf.fused_kernel, buf.fused_bias, stream));
    // Untiled, the joint values and the rounded logits (T, not float32) are kept.
    return fused::forward(s, o, fused_tile(in, buf, 0, host.num_nodes), a.lattice, a.lse, stream,
                          a.saved_hidden, Hz, a.saved_logits, Vp);
  }
  padded_kernel_kernel<T><<<blocks_for(static_cast<int64_t>(Hk) * Vp, 256), 256, 0, stream>>>(
      static_cast<const T*>(in.kernel), H, V, Hk, Vp, true, 0, buf.kernel_t);
  padded_bias_kernel<T>
      <<<blocks_for(Vp, 256), 256, 0, stream>>>(static_cast<const T*>(in.bias), V, Vp, 0, buf.bias);
  node_offsets_kernel<<<1, 1, 0, stream>>>(in.logit_lengths, in.label_lengths, s.B, buf.offsets);
  for (int64_t n0 = 0; n0 < host.num_nodes; n0 += tile) {
    const int64_t rows = std::min(tile, host.num_nodes - n0);
    T* z = untiled ? static_cast<T*>(a.saved_hidden) : buf.tile_z;
    L* logits =
        untiled ? reinterpret_cast<L*>(a.saved_logits) : reinterpret_cast<L*>(buf.tile_logits);
    hidden_kernel<T><<<grid_warps(rows), 32 * kWarps, 0, stream>>>(
        n0, rows, static_cast<const T*>(in.encoder), static_cast<const T*>(in.predictor),
        buf.offsets, in.label_lengths, s.B, s.T, s.U1, H, Hz, o.activation, z);
    RETURN_IF_ERROR(gemm_row_major(handle, false, true, static_cast<int>(rows), Vp, Hk, z,
                                   cuda_type<T>(), Hz, buf.kernel_t, cuda_type<T>(), Hk, 0.f,
                                   logits, cuda_type<L>(), Vp, o.allow_tf32));
    picks_kernel<L><<<grid_warps(rows), 32 * kWarps, 0, stream>>>(
        n0, rows, logits, buf.bias, in.labels, buf.offsets, in.label_lengths, s.B, s.T, s.U1, Vp,
        o.blank, a.lattice, a.lse);
    RETURN_IF_ERROR(last_launch_status());
  }
  return Status();
}

// The gradients into acc (zeroed here first).
template <typename T, typename L>
Status accumulate_grads(const JointShape& s, const JointOptions& o, const JointBackwardArgs& a,
                        const JointBuffers<T>& buf, const GradAccumulators& acc,
                        cudaStream_t stream) {
  const JointInputs& in = a.in;
  const HostPlan& host = in.host;
  const int H = s.H, V = s.V, Vp = buf.Vp;
  const int Hz = hidden_width(s), Hk = round_up_to_8(H);
  const GradSizes sizes(s);
  RETURN_IF_ERROR(
      cuda_status(cudaMemsetAsync(acc.d_encoder, 0, sizeof(float) * sizes.encoder, stream)));
  RETURN_IF_ERROR(
      cuda_status(cudaMemsetAsync(acc.d_predictor, 0, sizeof(float) * sizes.predictor, stream)));
  RETURN_IF_ERROR(
      cuda_status(cudaMemsetAsync(acc.d_kernel, 0, sizeof(float) * sizes.kernel, stream)));
  RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(acc.d_bias, 0, sizeof(float) * sizes.bias, stream)));
  if (host.num_nodes == 0) return Status();
  cublasHandle_t handle;
  RETURN_IF_ERROR(cublas_handle_for(stream, &handle));
  const bool untiled = a.saved_logits != nullptr;
  bool on_chip = false;
  RETURN_IF_ERROR(use_fused(s, o, &on_chip));
  const bool recompute_on_chip = on_chip && !untiled;  // the fused recompute runs the tiles
  // The buffers hold host.tile_nodes; the fused path may step by fewer (whole waves).
  const int64_t buffer_tile = untiled ? host.num_nodes : host.tile_nodes;
  const int64_t tile = recompute_on_chip ? fused::wave_tile(s, o, buffer_tile) : buffer_tile;
  const T* encoder = static_cast<const T*>(in.encoder);
  const T* predictor = static_cast<const T*>(in.predictor);
  // Vocabulary columns the fused recompute sums on chip, past the d kernel GEMM's V0.
  const int tail = recompute_on_chip ? fused::tail_columns(s) : 0;
  const int V0 = V - tail;
  const int64_t tail_floats = tail > 0 ? fused::tail_sum_floats(s, tile) : 0;
  if (recompute_on_chip) {
    RETURN_IF_ERROR(
        fused::prepare(s, o, in.kernel, in.bias, buf.fused_kernel, buf.fused_bias, stream));
    if (tail > 0) {
      RETURN_IF_ERROR(
          cuda_status(cudaMemsetAsync(buf.tail_sums, 0, sizeof(float) * tail_floats, stream)));
    }
    // The d logits columns past the recompute's, which the d hidden GEMM sums over: zeros.
    const int written = logits_width(s);
    if (Vp > written) {
      RETURN_IF_ERROR(cuda_status(cudaMemset2DAsync(
          buf.tile_logits + written, sizeof(T) * Vp, 0, sizeof(T) * (Vp - written),
          static_cast<size_t>((buffer_tile + 7) / 8 * 8), stream)));
    }
  }
  // The fused kernels' logits and d logits columns, as they store them.
  const int permuted = on_chip ? fused::permuted_columns(V) : 0;
  padded_kernel_kernel<T><<<blocks_for(static_cast<int64_t>(Hk) * Vp, 256), 256, 0, stream>>>(
      static_cast<const T*>(in.kernel), H, V, Hk, Vp, false, permuted, buf.kernel);
  if (!untiled && !on_chip) {
    padded_kernel_kernel<T><<<blocks_for(static_cast<int64_t>(Hk) * Vp, 256), 256, 0, stream>>>(
        static_cast<const T*>(in.kernel), H, V, Hk, Vp, true, 0, buf.kernel_t);
  }
  padded_bias_kernel<T><<<blocks_for(Vp, 256), 256, 0, stream>>>(static_cast<const T*>(in.bias), V,
                                                                 Vp, permuted, buf.bias);
  node_offsets_kernel<<<1, 1, 0, stream>>>(in.logit_lengths, in.label_lengths, s.B, buf.offsets);
  RETURN_IF_ERROR(cuda_status(
      cudaMemsetAsync(buf.d_kernel, 0, sizeof(float) * static_cast<size_t>(Hz) * Vp, stream)));
  const int h_threads = H >= 128 ? 128 : std::max(32, (H + 31) / 32 * 32);
  const int h_slices = (H + h_threads - 1) / h_threads;
  for (int64_t n0 = 0; n0 < host.num_nodes; n0 += tile) {
    const int64_t rows = std::min(tile, host.num_nodes - n0);
    const T* z;
    int z_ld = 0;  // z^T's row stride, or 0: z is [rows, Hz]
    L* logits;
    if (untiled) {
      z = static_cast<const T*>(a.saved_hidden);
      logits = reinterpret_cast<L*>(a.saved_logits);
    } else if (recompute_on_chip) {  // z and d logits of the tile, the logits kept on chip
      RETURN_IF_ERROR(fused::recompute(s, o, fused_tile(in, buf, n0, rows), a.lse, a.d_lattice,
                                       buf.tile_z, Hz, buf.tile_logits, Vp, buf.tail_sums, stream));
      logits = reinterpret_cast<L*>(buf.tile_logits);
      z = buf.tile_z;
    } else {  // recompute the tile (activation checkpointing), z transposed
      // The GEMMs that run along the nodes take z_ld of them, a multiple of 8 (an unaligned count
      // sends cuBLAS to far slower kernels); the padding nodes' z and logits are zero.
      z_ld = round_up_to_8(static_cast<int>(rows));
      if constexpr (sizeof(T) == sizeof(float)) {
        hidden_t_shared_kernel<T>
            <<<static_cast<unsigned>((z_ld + kTransposeTile - 1) / kTransposeTile),
               dim3(kTransposeTile, kTransposeRows), 0, stream>>>(
                n0, rows, encoder, predictor, buf.offsets, in.label_lengths, s.B, s.T, s.U1, H, Hz,
                o.activation, z_ld, buf.tile_z);
      } else {
        hidden_t_kernel<T>
            <<<static_cast<unsigned>((z_ld + kTransposeThreads - 1) / kTransposeThreads),
               kTransposeThreads, 0, stream>>>(n0, rows, encoder, predictor, buf.offsets,
                                               in.label_lengths, s.B, s.T, s.U1, H, Hz,
                                               o.activation, z_ld, buf.tile_z);
      }
      logits = reinterpret_cast<L*>(buf.tile_logits);
      RETURN_IF_ERROR(gemm_row_major(handle, true, true, z_ld, Vp, Hk, buf.tile_z, cuda_type<T>(),
                                     z_ld, buf.kernel_t, cuda_type<T>(), Hk, 0.f, logits,
                                     cuda_type<L>(), Vp, o.allow_tf32));
      z = buf.tile_z;
    }
    // d logits over the logits when they share a dtype (the fused forward kept T logits).
    T* d_logits = sizeof(L) == sizeof(T) || on_chip ? reinterpret_cast<T*>(logits) : buf.d_logits;
    if (on_chip && untiled) {
      logit_grads_kernel<T, T><<<grid_warps(rows), 32 * kWarps, 0, stream>>>(
          n0, rows, d_logits, buf.bias, in.labels, buf.offsets, in.label_lengths, s.B, s.T, s.U1, V,
          Vp, permuted, o.blank, a.lse, a.d_lattice, d_logits);
    } else if (!on_chip) {
      logit_grads_kernel<L, T><<<grid_warps(rows), 32 * kWarps, 0, stream>>>(
          n0, rows, logits, buf.bias, in.labels, buf.offsets, in.label_lengths, s.B, s.T, s.U1, V,
          Vp, 0, o.blank, a.lse, a.d_lattice, d_logits);
    }
    // [d kernel; d bias] += [z, 1]^T @ d logits (ordered over tiles). In 16-bit dtypes cuBLAS
    // runs whole chunks of 128 columns far faster than a few more (rnnt_h200_fused.md,
    // rnnt_h100_untiled.md; not in TF32): after the fused recompute with a tail, the columns up to
    // V0 (it sums the tail's itself); otherwise the whole chunks, then the rest in a second GEMM.
    const int whole = fused::permuted_columns(V);
    const int split = sizeof(T) == 2 && tail == 0 && whole > 0 && whole < V ? whole : 0;
    const auto d_kernel_gemm = [&](int c0, int c1) {
      return gemm_row_major(handle, z_ld == 0, false, Hz, c1 - c0,
                            z_ld ? z_ld : static_cast<int>(rows), z, cuda_type<T>(),
                            z_ld ? z_ld : Hz, d_logits + c0, cuda_type<T>(), Vp, 1.f,
                            buf.d_kernel + c0, CUDA_R_32F, Vp, o.allow_tf32);
    };
    RETURN_IF_ERROR(d_kernel_gemm(0, tail > 0 ? V0 : split > 0 ? split : Vp));
    if (split > 0) RETURN_IF_ERROR(d_kernel_gemm(split, Vp));
    // d hidden = d logits @ Kp^T, over z's buffer (z is not needed any more).
    T* d_hidden = untiled ? static_cast<T*>(a.saved_hidden) : buf.tile_z;
    RETURN_IF_ERROR(gemm_row_major(handle, false, true, static_cast<int>(rows), Hk, Vp, d_logits,
                                   cuda_type<T>(), Vp, buf.kernel, cuda_type<T>(), Vp, 0.f,
                                   d_hidden, cuda_type<T>(), Hz, o.allow_tf32));
    const TilePlan tp = plan_tile(n0, rows, host, s.B);
    // Two 16-bit columns per 4-byte access where H allows it.
    constexpr int kPair = sizeof(T) == 2 ? 2 : 1;
    const bool paired = kPair == 2 && H % 2 == 0;
    const int columns = 32 * (paired ? kPair : 1);
    const dim3 grid(static_cast<unsigned>(tp.chunks), (H + columns - 1) / columns);
    auto hidden_grads = paired ? hidden_grads_kernel<T, kPair> : hidden_grads_kernel<T, 1>;
    if (H > 0) {  // H = 0: d encoder and d predictor are empty (and a zero grid is invalid)
      hidden_grads<<<grid, 32 * kGradWarps, 0, stream>>>(
          n0, rows, tp.span, d_hidden, encoder, predictor, buf.offsets, in.logit_lengths,
          in.label_lengths, s.T, s.U1, H, Hz, o.activation, acc.d_encoder, buf.partials);
      predictor_grad_kernel<<<dim3(static_cast<unsigned>(tp.label_pairs), h_slices), h_threads, 0,
                              stream>>>(tp.span, buf.partials, in.logit_lengths, in.label_lengths,
                                        s.U1, H, acc.d_predictor);
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

template <typename T, typename L>
Status backward(const JointShape& s, const JointOptions& o, const JointBackwardArgs& a,
                cudaStream_t stream) {
  const bool untiled = a.saved_logits != nullptr;
  const int64_t tile = untiled ? a.in.host.num_nodes : a.in.host.tile_nodes;
  const JointBuffers<T> buf(a.workspace, s, o, tile, true, untiled);
  constexpr bool kFloat = std::is_same<T, float>::value;
  const GradAccumulators acc = kFloat ? GradAccumulators::of_outputs(a) : buf.acc;
  RETURN_IF_ERROR((accumulate_grads<T, L>(s, o, a, buf, acc, stream)));
  if (kFloat) return Status();
  // The gradients in T, from their float32 accumulators.
  const GradSizes sizes(s);
  const float* from[4] = {acc.d_encoder, acc.d_predictor, acc.d_kernel, acc.d_bias};
  void* to[4] = {a.d_encoder, a.d_predictor, a.d_kernel, a.d_bias};
  const int64_t count[4] = {sizes.encoder, sizes.predictor, sizes.kernel, sizes.bias};
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

// pass(T(), L()) for the dtype T and the logits' type L (float32 where untiled mode keeps them).
template <typename Args, typename Pass>
Status dispatch_pass(const JointOptions& options, const Args& args, Pass&& pass) {
  Status status;
  dispatch_dtype_cuda(options.dtype, [&](auto tag) {
    status = args.saved_logits != nullptr ? pass(tag, float()) : pass(tag, tag);
  });
  return status;
}

Status joint_forward_cuda(const JointShape& shape, const JointOptions& options,
                          const JointForwardArgs& args, GpuStream stream) {
  return dispatch_pass(options, args, [&](auto t, auto l) {
    return forward<decltype(t), decltype(l)>(shape, options, args,
                                             static_cast<cudaStream_t>(stream));
  });
}

Status joint_backward_cuda(const JointShape& shape, const JointOptions& options,
                           const JointBackwardArgs& args, GpuStream stream) {
  return dispatch_pass(options, args, [&](auto t, auto l) {
    return backward<decltype(t), decltype(l)>(shape, options, args,
                                              static_cast<cudaStream_t>(stream));
  });
}

}  // namespace tf_rnnt
