// The fused joint tile kernels of the CUDA launchers (joint_fused.cu): per tile of packed lattice
// nodes, the joint values act(encoder + predictor) are formed in shared memory and fed to
// tensor-core GEMMs against the output layer; the logits never leave the chip.
//   forward:   online log-sum-exp over V and the blank/label picks -> lattice, lse (kept: the
//              joint values and the logits written too, for the untiled backward)
//   recompute: d logits from the lattice gradients (the backward pass's tile), written with the
//              joint values for the two backward GEMMs
// Hopper's wgmma kernels (sm_90a code, compute capability 9.0); joint_cuda.cu runs its cuBLAS
// path where they do not apply.
#ifndef TF_RNNT_JOINT_FUSED_H_
#define TF_RNNT_JOINT_FUSED_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {
namespace fused {

// Why the fused kernels cannot run this joint on the current device, or null when they can.
const char* unsupported_reason(const JointShape& shape, const JointOptions& options);

// Elements of the prepared output layer (kernel transposed to [Vw, Hk], zero padded: dtype) and
// of the padded bias ([Vw] float32, -inf padding).
int64_t prepared_kernel_elements(const JointShape& shape);
int64_t prepared_bias_elements(const JointShape& shape);

// Vocabulary columns past the last whole chunk of 128 when there are at most 8 of them (say a
// blank appended to 2^k labels), else 0. The recompute sums their d kernel and d bias columns on
// chip, so that the backward's d kernel GEMM can cover whole chunks: cuBLAS takes about 1.6x as
// long for [648, 1032] as for [648, 1024] (docs/design.md).
int tail_columns(const JointShape& shape);
// The backward's tile: the most nodes, up to `tile`, that fill whole waves of the recompute (as
// many blocks as the SMs hold at once), or `tile` if it holds less than one wave. A tile of 4.5
// waves takes as long as one of 5.
int64_t wave_tile(const JointShape& shape, const JointOptions& options, int64_t tile);
// Floats of those sums for tiles of at most `tile` nodes: [slots, tail_columns, H + 1], the last
// of H + 1 being d bias; a slot per 64 nodes (a block of the recompute adds to one), zeros where
// no block adds.
int64_t tail_sum_floats(const JointShape& shape, int64_t tile);

// The output layer in the fused kernels' layout.
Status prepare(const JointShape& shape, const JointOptions& options, const void* kernel,
               const void* bias, void* prepared_kernel, float* prepared_bias, cudaStream_t stream);

// The tile [n0, n0 + rows) of packed nodes; offsets [B + 1] on the device.
struct Tile {
  const void* encoder = nullptr;
  const void* predictor = nullptr;
  const void* prepared_kernel = nullptr;
  const float* prepared_bias = nullptr;
  const int32_t* labels = nullptr;
  const int64_t* offsets = nullptr;
  const int32_t* label_lengths = nullptr;
  int64_t n0 = 0, rows = 0;
};

// lattice [B, T, U1, 2] (the tile's nodes) and lse [num_nodes] (packed). Kept (z_out and
// logits_out set; untiled mode), also the joint values as recompute writes them and the logits
// rounded to dtype, without bias, [rows, logits_width] laid out as recompute's d logits (columns
// of the vocabulary's tail chunk in order; past it nothing is written).
Status forward(const JointShape& shape, const JointOptions& options, const Tile& tile,
               float* lattice, float* lse, cudaStream_t stream, void* z_out = nullptr,
               int z_width = 0, void* logits_out = nullptr, int logits_width = 0);

// Where the recompute stores d logits column v: within each group of 32 columns below
// permuted_columns(V) (the whole chunks of 128), 2-column pair (8 a + 2 b) goes to 8 b + 2 a, so
// that each thread stores the pairs its tensor-core fragment holds in one 16-byte access. The map
// is its own inverse; the backward GEMMs take the output layer's columns and give d kernel's in
// that order.
__host__ __device__ inline int permuted_columns(int V) { return V / 128 * 128; }
__host__ __device__ inline int stored_column(int v, int permuted) {
  if (v >= permuted) return v;
  const int o = v & 31;
  return (v & ~31) | ((o & 6) << 2) | ((o >> 3) << 1) | (o & 1);
}

// d logits [rows, logits width] (dtype, columns placed by stored_column, zero padding) and the
// joint values [rows, hidden width] (dtype: H activations, a ones column, zeros), as joint_cuda.cu
// lays out its tile buffers; with tail_columns > 0, the tail columns' [z, 1]^T d logits added to
// tail_sums (tail_sum_floats; block k of every tile adds to slot k, in tile order).
Status recompute(const JointShape& shape, const JointOptions& options, const Tile& tile,
                 const float* lse, const float* d_lattice, void* z_out, int z_width, void* d_logits,
                 int logits_width, float* tail_sums, cudaStream_t stream);

}  // namespace fused
}  // namespace tf_rnnt

#endif  // TF_RNNT_JOINT_FUSED_H_
