// The fused joint tile kernels' host side: which kernels run a joint on the current device, the
// prepared output layer, and the launches (joint_fused.h). The kernels (joint_fused_sm90.cu) are
// Hopper's, sm_90a code, 128 nodes a block.
#include "joint_fused.h"

#include "joint_fused_tile.cuh"

namespace tf_rnnt {
namespace fused {

using namespace detail;

namespace {

// Nodes per tail-sum slot: a slot per 64 nodes, at least one per block of kWgmmaRows.
constexpr int64_t kTailSlotRows = 64;

int k_extent(const JointShape& s) { return round_up(s.H, kKBlock); }
int vocab_extent(const JointShape& s) { return round_up(s.V, kChunk); }

// kernel_t: for each step (chunk c, K block kb) the 16 KB image its buffer takes, rows
// v = c kChunk + r, 16-byte chunks swizzled as in Z, holding kernel[h, v] for
// h = kb kKBlock + 8 chunk + e, zeros outside [H, V]; bias [Vw] float32, -inf outside V.
template <typename T>
__global__ void prepare_kernel(const T* __restrict__ kernel, const T* __restrict__ bias, int H,
                               int V, int Hk, int Vw, T* __restrict__ kernel_t,
                               float* __restrict__ bias_out) {
  const int64_t total = static_cast<int64_t>(Vw) * Hk;
  const int kblocks = Hk / kKBlock;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int v = static_cast<int>(i / Hk), h = static_cast<int>(i % Hk);
    const int c = v / kChunk, r = v % kChunk, kb = h / kKBlock, e = h % 8;
    const int chunk = (h % kKBlock) / 8;
    const int64_t step = static_cast<int64_t>(c) * kblocks + kb;
    const int64_t at = step * (kStageBytes / 2) + swizzled(r, chunk) / 2 + e;
    kernel_t[at] = v < V && h < H ? kernel[static_cast<int64_t>(h) * V + v] : from_float<T>(0.f);
    if (h == 0) bias_out[v] = v < V ? to_float(bias[v]) : kNegInf;
  }
}

Status invalid(const char* message) {
  Status s;
  s.code = StatusCode::kInvalidArgument;
  s.message = message;
  return s;
}

template <typename Fn>
Status dispatch_half(DType dtype, Fn&& fn) {
  if (dtype == DType::kBFloat16) return fn(__nv_bfloat16());
  if (dtype == DType::kFloat16) return fn(__half());
  return invalid("the fused joint kernels take float16 or bfloat16");
}

// Why the fused kernels cannot run this joint here, or null when they can.
const char* pick(const JointShape& s, const JointOptions& o) {
  if (o.dtype == DType::kFloat32) return "the fused joint kernels take float16 or bfloat16";
  if (s.D > 0) return "the fused joint kernels take no duration head (TDT)";
  if (s.H < 8 || s.H > kMaxH || s.H % 8 != 0) {
    return "the fused joint kernels need H, a multiple of 8, in [8, 640]";
  }
  int device = 0, major = 0, minor = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    return "the current CUDA device could not be queried";
  }
  if (major != 9 || minor != 0) {
    return "the fused joint kernels need a GPU of compute capability 9.0 (Hopper)";
  }
#if TF_RNNT_FUSED_SM90A
  if (static_cast<size_t>(optin) < wgmma_smem_bytes(s)) {
    return "the fused joint kernels need more shared memory than this GPU offers a block";
  }
  return nullptr;
#else
  return "this build of the library has no sm_90a code for the fused joint kernels";
#endif
}

template <typename T, bool kRecompute>
Status launch(const JointShape& s, const JointOptions& o, const Tile& tile, Params<T> p,
              cudaStream_t stream) {
  const char* why = pick(s, o);
  if (why) return invalid(why);
  if (tile.rows == 0) return Status();
  p.encoder = static_cast<const T*>(tile.encoder);
  p.predictor = static_cast<const T*>(tile.predictor);
  p.kernel_t = static_cast<const T*>(tile.prepared_kernel);
  p.bias = tile.prepared_bias;
  p.labels = tile.labels;
  p.offsets = tile.offsets;
  p.label_lengths = tile.label_lengths;
  p.B = s.B;
  p.T_max = s.T;
  p.U1 = s.U1;
  p.H = s.H;
  p.Hk = k_extent(s);
  p.V = s.V;
  p.blank = o.blank;
  p.activation = o.activation;
  p.n0 = tile.n0;
  p.rows = tile.rows;
  return launch_wgmma<T, kRecompute>(s, p, stream);
}

}  // namespace

const char* unsupported_reason(const JointShape& s, const JointOptions& o) { return pick(s, o); }

int64_t prepared_kernel_elements(const JointShape& s) {
  return static_cast<int64_t>(vocab_extent(s)) * k_extent(s);
}

int64_t prepared_bias_elements(const JointShape& s) { return vocab_extent(s); }

int tail_columns(const JointShape& s) {
  const int tail = s.V % kChunk;
  return s.V > kChunk && tail <= 8 ? tail : 0;
}

int64_t wave_tile(const JointShape& s, const JointOptions& o, int64_t tile) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return tile;
  }
  // The kernels hold one block an SM (their shared memory).
  const int64_t wave = pick(s, o) == nullptr ? int64_t{sms} * kWgmmaRows : 0;
  return wave > 0 && tile >= wave ? tile / wave * wave : tile;
}

int64_t tail_sum_floats(const JointShape& s, int64_t tile) {
  const int columns = tail_columns(s);
  if (columns == 0) return 0;
  return (tile + kTailSlotRows - 1) / kTailSlotRows * columns * (s.H + 1);
}

Status prepare(const JointShape& s, const JointOptions& o, const void* kernel, const void* bias,
               void* prepared_kernel, float* prepared_bias, cudaStream_t stream) {
  return dispatch_half(o.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t total = prepared_kernel_elements(s);
    prepare_kernel<T><<<blocks_for(total, 256), 256, 0, stream>>>(
        static_cast<const T*>(kernel), static_cast<const T*>(bias), s.H, s.V, k_extent(s),
        vocab_extent(s), static_cast<T*>(prepared_kernel), prepared_bias);
    return last_launch_status();
  });
}

Status forward(const JointShape& s, const JointOptions& o, const Tile& tile, float* lattice,
               float* lse, cudaStream_t stream, void* z_out, int z_width, void* logits_out,
               int logits_width) {
  if ((z_out == nullptr) != (logits_out == nullptr)) {
    return invalid("fused forward: joint values and logits are kept together");
  }
  if (logits_out &&
      (z_width < s.H + 1 || z_width % 8 != 0 || logits_width < s.V || logits_width % 8 != 0)) {
    return invalid("fused forward: kept buffers narrower than the joint or unaligned");
  }
  return dispatch_half(o.dtype, [&](auto tag) {
    using T = decltype(tag);
    Params<T> p{};
    p.lattice = lattice;
    p.lse = lse;
    p.z_out = static_cast<T*>(z_out);
    p.z_width = z_width;
    p.logits_out = static_cast<T*>(logits_out);
    p.logits_width = logits_width;
    return launch<T, false>(s, o, tile, p, stream);
  });
}

Status recompute(const JointShape& s, const JointOptions& o, const Tile& tile, const float* lse,
                 const float* d_lattice, void* z_out, int z_width, void* d_logits, int logits_width,
                 float* tail_sums_out, cudaStream_t stream) {
  if (z_width < s.H + 1 || logits_width < s.V || logits_width % 8 != 0) {
    return invalid("fused recompute: tile buffers narrower than the joint");
  }
  if (tail_columns(s) > 0 && tail_sums_out == nullptr) {
    return invalid("fused recompute: no buffer for the tail columns' sums");
  }
  return dispatch_half(o.dtype, [&](auto tag) {
    using T = decltype(tag);
    Params<T> p{};
    p.lse = const_cast<float*>(lse);
    p.d_lattice = d_lattice;
    p.z_out = static_cast<T*>(z_out);
    p.z_width = z_width;
    p.d_logits = static_cast<T*>(d_logits);
    p.logits_width = logits_width;
    p.tail_width = tail_columns(s);
    p.tail_sums = tail_sums_out;
    return launch<T, true>(s, o, tile, p, stream);
  });
}

}  // namespace fused
}  // namespace tf_rnnt
