// Tests of the framework-free core: the launchers of rnnt_core.h called directly (no TensorFlow)
// on small problems, against float64 brute force written here from the definitions: the lattice
// loss by enumerating every alignment, the log-softmax and the joint by explicit loops.
//
//   build/tests/core_test          CPU launchers, then the GPU launchers when a GPU is present
//
// Exit status 0 when every case that ran passed (a missing GPU is reported as skipped, not as
// passed); 1 otherwise. TF_RNNT_CORE_TEST_REQUIRE_GPU=1 makes a skipped GPU half a failure, and
// TF_RNNT_CORE_TEST_REQUIRE_FUSED=1 (for compute capability 9.0) a skipped fused-kernel
// case. TF_RNNT_CORE_TEST_FUSED_ONLY=1 runs only the GPU's fused-kernel cases (say under
// compute-sanitizer, whose initcheck does not see what cuBLAS writes).
#include "core_test.h"

#include "tf_rnnt/dtype_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace tf_rnnt {
namespace test {
namespace {

// The float64 references.
#include "core_test_reference.h"  // NOLINT: inside the namespace

// ------------------------------------------------------------------ CPU backend
void serial_parallel_for(int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
  // Three shards in turn: the launchers' shard boundaries get exercised.
  const int64_t step = std::max<int64_t>(1, (total + 2) / 3);
  for (int64_t begin = 0; begin < total; begin += step) fn(begin, std::min(total, begin + step));
}

class CpuBackend : public Backend {
 public:
  const char* name() const override { return "cpu"; }

  Status lattice_loss(const std::vector<float>& lattice, const std::vector<int32_t>& logit_lengths,
                      const std::vector<int32_t>& label_lengths, int B, int T, int U1,
                      const LatticeLossOptions& options, std::vector<float>* costs,
                      std::vector<float>* grads) override {
    costs->assign(B, 0.f);
    grads->assign(lattice.size(), 0.f);
    std::vector<float> alphas(static_cast<size_t>(B) * T * U1), betas(alphas.size());
    return lattice_loss_cpu(lattice.data(), logit_lengths.data(), label_lengths.data(), B, T, U1,
                            options, costs->data(), grads->data(), alphas.data(), betas.data(),
                            serial_parallel_for);
  }

  Status logits_to_lattice(const std::vector<float>& logits, const std::vector<int32_t>& labels,
                           int B, int T, int U1, int V, int blank, std::vector<float>* lattice,
                           std::vector<float>* lse) override {
    lattice->assign(static_cast<size_t>(B) * T * U1 * 2, 0.f);
    lse->assign(static_cast<size_t>(B) * T * U1, 0.f);
    return logits_to_lattice_cpu(logits.data(), DType::kFloat32, labels.data(), B, T, U1, V, blank,
                                 lattice->data(), lse->data(), serial_parallel_for);
  }

  Status logits_to_lattice_grad(const std::vector<float>& logits,
                                const std::vector<int32_t>& labels, int B, int T, int U1, int V,
                                int blank, const std::vector<float>& lse,
                                const std::vector<float>& d_lattice,
                                std::vector<float>* d_logits) override {
    d_logits->assign(logits.size(), 0.f);
    return logits_to_lattice_grad_cpu(logits.data(), DType::kFloat32, labels.data(), B, T, U1, V,
                                      blank, lse.data(), d_lattice.data(), d_logits->data(),
                                      serial_parallel_for);
  }

  Status joint(const JointCase& c, int64_t tile_nodes, const std::vector<float>& d_lattice,
               JointResult* r) override {
    const JointShape& s = c.shape;
    std::vector<int64_t> offsets(s.B + 1);
    joint_node_offsets(c.logit_lengths.data(), c.label_lengths.data(), s.B, offsets.data());
    const bool untiled = tile_nodes <= 0;
    JointInputs in;
    in.encoder = c.encoder.data();
    in.predictor = c.predictor.data();
    in.kernel = c.kernel.data();
    in.bias = c.bias.data();
    in.labels = c.labels.data();
    in.logit_lengths = in.host.logit_lengths = c.logit_lengths.data();
    in.label_lengths = in.host.label_lengths = c.label_lengths.data();
    in.host.node_offsets = offsets.data();
    in.host.num_nodes = offsets[s.B];
    in.host.tile_nodes = untiled ? offsets[s.B] : tile_nodes;
    const JointSavedSizes saved = joint_saved_sizes_cpu(s, c.options, untiled ? offsets[s.B] : 0);
    std::vector<float> saved_hidden(saved.hidden), saved_logits(saved.logits);
    std::vector<char> workspace(
        std::max(joint_workspace_bytes_cpu(s, c.options, in.host.tile_nodes, false, untiled),
                 joint_workspace_bytes_cpu(s, c.options, in.host.tile_nodes, true, untiled)) +
        1);
    r->lattice.assign(static_cast<size_t>(s.B) * s.T * s.U1 * lattice_channels(s), -1.f);
    r->lse.assign(offsets[s.B], 0.f);
    JointForwardArgs f;
    f.in = in;
    f.workspace = workspace.data();
    f.lattice = r->lattice.data();
    f.lse = r->lse.data();
    f.saved_hidden = untiled ? saved_hidden.data() : nullptr;
    f.saved_logits = untiled ? saved_logits.data() : nullptr;
    Status st = joint_forward_cpu(s, c.options, f, serial_parallel_for);
    if (!st.ok()) return st;
    r->d_encoder.assign(c.encoder.size(), -1.f);
    r->d_predictor.assign(c.predictor.size(), -1.f);
    r->d_kernel.assign(c.kernel.size(), -1.f);
    r->d_bias.assign(c.bias.size(), -1.f);
    JointBackwardArgs g;
    g.in = in;
    g.workspace = workspace.data();
    g.lse = r->lse.data();
    g.d_lattice = d_lattice.data();
    g.saved_hidden = f.saved_hidden;
    g.saved_logits = f.saved_logits;
    g.d_encoder = r->d_encoder.data();
    g.d_predictor = r->d_predictor.data();
    g.d_kernel = r->d_kernel.data();
    g.d_bias = r->d_bias.data();
    return joint_backward_cpu(s, c.options, g, serial_parallel_for);
  }
};

// ------------------------------------------------------------------ checks
struct Report {
  int passed = 0, failed = 0, fused_skipped = 0;
};

// TF_RNNT_CORE_TEST_FUSED_ONLY=1 runs only the fused-kernel cases.
bool fused_only() {
  const char* v = std::getenv("TF_RNNT_CORE_TEST_FUSED_ONLY");
  return v && std::string(v) == "1";
}

bool close(const char* what, const std::string& where, const std::vector<float>& got,
           const std::vector<double>& want, double rtol, double atol) {
  if (got.size() != want.size()) {
    std::printf("    FAIL %s %s: %zu values, expected %zu\n", where.c_str(), what, got.size(),
                want.size());
    return false;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]))) {
      std::printf("    FAIL %s %s[%zu] = %.9g, expected %.9g\n", where.c_str(), what, i, got[i],
                  want[i]);
      return false;
    }
  }
  return true;
}

void record(Report* report, const std::string& name, bool ok) {
  std::printf("  %s %s\n", ok ? "ok  " : "FAIL", name.c_str());
  (ok ? report->passed : report->failed) += 1;
}

std::vector<float> uniform(std::mt19937* rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> out(n);
  for (float& x : out) x = d(*rng);
  return out;
}

// Labels in [0, V) other than blank.
std::vector<int32_t> random_labels(std::mt19937* rng, int B, int U, int V, int blank) {
  std::uniform_int_distribution<int> d(0, V - 2);
  std::vector<int32_t> out(static_cast<size_t>(B) * U);
  for (int32_t& y : out) {
    y = d(*rng);
    if (y >= blank) ++y;
  }
  return out;
}

std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

void test_lattice_ops(Backend* be, Report* report) {
  std::mt19937 rng(1);
  const int B = 3, T = 5, U1 = 4, V = 6;
  const std::vector<int32_t> T_len = {5, 3, 1}, U_len = {3, 0, 2};
  for (int blank : {0, V - 1}) {
    const std::vector<float> logits = uniform(&rng, static_cast<size_t>(B) * T * U1 * V, -3, 3);
    const std::vector<int32_t> labels = random_labels(&rng, B, U1 - 1, V, blank);
    std::vector<double> lattice64, lse64;
    log_softmax_picks(to_double(logits), labels, B, T, U1, V, blank, &lattice64, &lse64);
    const std::string tag = std::string(be->name()) + " blank=" + std::to_string(blank);

    std::vector<float> lattice, lse;
    Status st = be->logits_to_lattice(logits, labels, B, T, U1, V, blank, &lattice, &lse);
    record(report, "logits_to_lattice " + tag,
           st.ok() && close("lattice", tag, lattice, lattice64, 1e-5, 1e-5) &&
               close("lse", tag, lse, lse64, 1e-5, 1e-5));

    const std::vector<float> d_lattice = uniform(&rng, lattice.size(), -1, 1);
    std::vector<float> d_logits;
    st = be->logits_to_lattice_grad(logits, labels, B, T, U1, V, blank, lse, d_lattice, &d_logits);
    record(report, "logits_to_lattice_grad " + tag,
           st.ok() && close("d_logits", tag, d_logits,
                            log_softmax_picks_grad(to_double(logits), labels, B, T, U1, V, blank,
                                                   to_double(d_lattice)),
                            1e-5, 1e-5));

    std::vector<float> lattice32(lattice64.begin(), lattice64.end());
    for (const LatticeLossOptions& options :
         {LatticeLossOptions{0.f, -1.f}, LatticeLossOptions{0.5f, -1.f},
          LatticeLossOptions{0.f, 0.05f}}) {
      std::vector<double> costs64, grads64;
      lattice_loss_reference(lattice32, T_len, U_len, B, T, U1, options, &costs64, &grads64);
      std::vector<float> costs, grads;
      st = be->lattice_loss(lattice32, T_len, U_len, B, T, U1, options, &costs, &grads);
      char name[160];
      std::snprintf(name, sizeof(name), "lattice_loss %s fastemit=%g clamp=%g", tag.c_str(),
                    options.fastemit_lambda, options.clamp);
      record(report, name,
             st.ok() && close("costs", name, costs, costs64, 1e-5, 1e-5) &&
                 close("grads", name, grads, grads64, 1e-5, 1e-5));
    }
  }
}

JointCase make_joint_case(std::mt19937* rng, int H, int V, Activation activation, int blank,
                          int D = 0) {
  JointCase c;
  c.shape.B = 3;
  c.shape.T = 5;
  c.shape.U1 = 4;
  c.shape.H = H;
  c.shape.V = V;
  c.shape.D = D;
  c.options.blank = blank;
  c.options.activation = activation;
  c.options.dtype = DType::kFloat32;
  c.options.allow_tf32 = false;
  const size_t B = c.shape.B, T = c.shape.T, U1 = c.shape.U1;
  c.encoder = uniform(rng, B * T * H, -1, 1);
  c.predictor = uniform(rng, B * U1 * H, -1, 1);
  c.kernel = uniform(rng, static_cast<size_t>(H) * V, -0.5f, 0.5f);
  c.bias = uniform(rng, V, -0.5f, 0.5f);
  c.labels = random_labels(rng, c.shape.B, c.shape.U1 - 1, V - D, blank);
  c.logit_lengths = {5, 2, 4};
  c.label_lengths = {3, 0, 2};
  return c;
}

void test_joint(Backend* be, Report* report) {
  std::mt19937 rng(2);
  const char* act_names[] = {"tanh", "relu", "identity"};
  // {H, V, D}. H = 7, V = 6: unaligned rows; H = 16, V = 24: the GPU's vector loads; H = 0: the
  // logits are the bias alone (GEMMs with K = 0); D > 0: TDT joints, whose last D columns are
  // duration logits (3 of 9: the duration columns straddle a 16-byte pack; 5 of 29).
  const int cases[][3] = {{7, 6, 0}, {16, 24, 0}, {0, 5, 0}, {7, 9, 3}, {16, 29, 5}};
  for (const auto& hvd : cases) {
    const int H = hvd[0], V = hvd[1], D = hvd[2];
    for (Activation act : {Activation::kTanh, Activation::kRelu, Activation::kIdentity}) {
      const int blank = act == Activation::kRelu ? V - D - 1 : 0;
      const JointCase c = make_joint_case(&rng, H, V, act, blank, D);
      const std::vector<float> d_lattice = uniform(
          &rng, static_cast<size_t>(c.shape.B) * c.shape.T * c.shape.U1 * lattice_channels(c.shape),
          -1, 1);
      std::vector<double> lattice64, d_enc, d_pred, d_kernel, d_bias;
      joint_reference(c, d_lattice, &lattice64, &d_enc, &d_pred, &d_kernel, &d_bias);
      // Tiles of 1 node, of 7 (tiles cross samples mid-frame), of all nodes; untiled mode.
      for (int64_t tile : {1, 7, 1000, 0}) {
        char name[160];
        std::snprintf(name, sizeof(name), "joint %s H=%d V=%d D=%d %s blank=%d %s", be->name(), H,
                      V, D, act_names[static_cast<int>(act)], blank,
                      tile > 0 ? ("tile=" + std::to_string(tile)).c_str() : "untiled");
        JointResult r;
        const Status st = be->joint(c, tile, d_lattice, &r);
        if (!st.ok()) std::printf("    status %d: %s\n", static_cast<int>(st.code), st.message);
        record(report, name,
               st.ok() && close("lattice", name, r.lattice, lattice64, 1e-5, 1e-5) &&
                   close("d_encoder", name, r.d_encoder, d_enc, 1e-4, 1e-5) &&
                   close("d_predictor", name, r.d_predictor, d_pred, 1e-4, 1e-5) &&
                   close("d_kernel", name, r.d_kernel, d_kernel, 1e-4, 1e-5) &&
                   close("d_bias", name, r.d_bias, d_bias, 1e-4, 1e-5));
      }
    }
  }
}

// ||got - want|| / ||want|| (infinite when got holds a NaN or an infinity).
double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return got.size() == want.size() ? std::sqrt(diff / std::max(norm, 1e-30)) : INFINITY;
}

bool close_norm(const char* what, const std::string& where, const std::vector<float>& got,
                const std::vector<double>& want, double tol) {
  const double e = relative_error(got, want);
  if (e <= tol) return true;
  std::printf("    FAIL %s %s: relative error %.3g > %.3g\n", where.c_str(), what, e, tol);
  return false;
}

std::vector<double> joint_values(const JointResult& r) {
  std::vector<double> all;
  for (const std::vector<float>* v :
       {&r.lattice, &r.lse, &r.d_encoder, &r.d_predictor, &r.d_kernel, &r.d_bias}) {
    all.insert(all.end(), v->begin(), v->end());
  }
  return all;
}

float round_to(float x, DType dtype) {
  if (dtype == DType::kBFloat16) return bf16_bits_to_float(float_to_bf16_bits(x));
  if (dtype == DType::kFloat16) return half_bits_to_float(float_to_half_bits(x));
  return x;
}

// A joint case with random inputs rounded to dtype (uniform in [-1, 1], the kernel scaled by
// 4 / sqrt(H)), B = logit_lengths.size() samples of at most T frames and U labels.
JointCase half_case(std::mt19937* rng, DType dtype, int H, int V, Activation act, bool blank_last,
                    int T, int U, const std::vector<int32_t>& logit_lengths,
                    const std::vector<int32_t>& label_lengths) {
  const int B = static_cast<int>(logit_lengths.size());
  JointCase c;
  c.shape = JointShape{B, T, U + 1, H, V};
  c.options.blank = blank_last ? V - 1 : 0;
  c.options.activation = act;
  c.options.dtype = dtype;
  const float scale = 4.f / std::sqrt(static_cast<float>(H));
  c.encoder = uniform(rng, static_cast<size_t>(B) * T * H, -1, 1);
  c.predictor = uniform(rng, static_cast<size_t>(B) * (U + 1) * H, -1, 1);
  c.kernel = uniform(rng, static_cast<size_t>(H) * V, -scale, scale);
  c.bias = uniform(rng, V, -0.5f, 0.5f);
  for (std::vector<float>* v : {&c.encoder, &c.predictor, &c.kernel, &c.bias}) {
    for (float& x : *v) x = round_to(x, dtype);
  }
  c.labels = random_labels(rng, B, U, V, c.options.blank);
  c.logit_lengths = logit_lengths;
  c.label_lengths = label_lengths;
  return c;
}

// Case c on the cuBLAS path and on each fused tile kernel that runs here, for each tile size (0:
// untiled mode, where the fused forward keeps the joint values and rounded logits), against the
// float64 reference (on the rounded inputs); with the last tile size also each fused one against
// the cuBLAS path; run to run bitwise with the last tile size and untiled.
void check_joint_half(Backend* be, Report* report, std::mt19937* rng, const JointCase& c,
                      const std::vector<int64_t>& tiles, const char* what) {
  const double tol = c.options.dtype == DType::kBFloat16 ? 1e-2 : 2e-3;
  const JointShape& sh = c.shape;
  const std::vector<float> d_lattice =
      uniform(rng, static_cast<size_t>(sh.B) * sh.T * sh.U1 * 2, -1, 1);
  std::vector<double> lattice64, d_enc, d_pred, d_kernel, d_bias;
  joint_reference(c, d_lattice, &lattice64, &d_enc, &d_pred, &d_kernel, &d_bias);
  char tag[200];
  std::snprintf(tag, sizeof(tag), "joint %s %s H=%d V=%d blank=%d%s", be->name(),
                c.options.dtype == DType::kBFloat16 ? "bfloat16" : "float16", sh.H, sh.V,
                c.options.blank, what);
  // The cuBLAS path and the fused kernels (Hopper's wgmma ones on compute capability 9.0).
  const JointKernel kernels[] = {JointKernel::kCublas, JointKernel::kFused};
  const char* kernel_names[] = {"cublas", "fused"};
  JointResult results[2];
  bool ran[2] = {false, false};
  for (int k = 0; k < 2; ++k) {
    JointCase ck = c;
    ck.options.kernel = kernels[k];
    std::pair<std::vector<float>, std::vector<float>> untiled_lattice;  // lattice, lse
    if (k > 0) {
      const char* why = be->fused_unavailable(ck);
      if (why) {
        std::printf("  SKIPPED %s %s: %s\n", kernel_names[k], tag, why);
        report->fused_skipped += 1;
        continue;
      }
    } else if (fused_only()) {
      continue;
    }
    for (int64_t tile : tiles) {
      const std::string name = std::string(tag) + " " + kernel_names[k] +
                               (tile > 0 ? " tile=" + std::to_string(tile) : " untiled");
      JointResult r;
      const Status st = be->joint(ck, tile, d_lattice, &r);
      if (!st.ok()) std::printf("    status %d: %s\n", static_cast<int>(st.code), st.message);
      bool ok = st.ok() && close_norm("lattice", name, r.lattice, lattice64, tol) &&
                close_norm("d_encoder", name, r.d_encoder, d_enc, tol) &&
                close_norm("d_predictor", name, r.d_predictor, d_pred, tol) &&
                close_norm("d_kernel", name, r.d_kernel, d_kernel, tol) &&
                close_norm("d_bias", name, r.d_bias, d_bias, tol);
      if (ok && (tile == tiles.back() || tile <= 0)) {
        JointResult again;
        const Status st2 = be->joint(ck, tile, d_lattice, &again);
        ok = st2.ok() && joint_values(again) == joint_values(r);
        if (!ok) std::printf("    FAIL %s: a second run differs\n", name.c_str());
      }
      if (ok && tile == tiles.back()) {
        results[k] = r;
        ran[k] = true;
      }
      if (ok && tile <= 0) untiled_lattice = {r.lattice, r.lse};
      record(report, name, ok);
    }
    // The fused forward keeping its values (untiled) computes what it computes tiled, bitwise.
    if (k > 0 && ran[k] && !untiled_lattice.first.empty()) {
      record(
          report, std::string(tag) + " " + kernel_names[k] + " untiled forward = tiled",
          untiled_lattice.first == results[k].lattice && untiled_lattice.second == results[k].lse);
    }
  }
  // The fused path against the cuBLAS path: the same rounding points, so closer to each other
  // than to float64.
  for (int k = 1; k < 2; ++k) {
    if (!ran[0] || !ran[k]) continue;
    const std::string name = std::string(tag) + " " + kernel_names[k] + " vs cublas";
    const char* names[] = {"lattice", "lse", "d_encoder", "d_predictor", "d_kernel", "d_bias"};
    const std::vector<float>* fused_out[] = {&results[k].lattice,   &results[k].lse,
                                             &results[k].d_encoder, &results[k].d_predictor,
                                             &results[k].d_kernel,  &results[k].d_bias};
    const std::vector<float>* cublas_out[] = {&results[0].lattice,   &results[0].lse,
                                              &results[0].d_encoder, &results[0].d_predictor,
                                              &results[0].d_kernel,  &results[0].d_bias};
    bool ok = true;
    for (int i = 0; i < 6 && ok; ++i) {
      ok = close_norm(names[i], name, *fused_out[i], to_double(*cublas_out[i]), tol / 4);
    }
    record(report, name, ok);
  }
}

// The joint in 16-bit dtypes on the GPU: the fused tile kernels and the cuBLAS path, each against
// the float64 reference (on the rounded inputs), against each other, and run to run bitwise.
// Shapes: several blocks of 128 nodes (the last one partial), a sample with no labels and one of
// one frame; H below, at and above one K block of 64; V with vocabulary chunks of 128 and tails of
// 24, 12, 44, 1, 5 and 0 columns (chunk widths 32, 16, 64, 8 and 128; the fused recompute sums
// the d kernel of tails of 1 and 5 columns on chip, the second holding labels). Then a lattice of
// several waves of the fused recompute (a block of 128 nodes per SM), whose tiles it cuts to
// whole waves.
void test_joint_half(Backend* be, Report* report) {
  std::mt19937 rng(3);
  struct HV {
    int H, V;
    Activation act;
    bool blank_last;
  };
  const HV shapes[] = {{16, 24, Activation::kTanh, false},  {32, 140, Activation::kTanh, false},
                       {40, 300, Activation::kRelu, true},  {64, 129, Activation::kIdentity, true},
                       {48, 133, Activation::kRelu, false}, {136, 256, Activation::kTanh, true},
                       {640, 1025, Activation::kTanh, true}};
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (const HV& hv : shapes) {
      // 386 nodes: 4 blocks of 128, the last with 2. Tiles of 100 nodes (a tile ends inside a
      // block of 128 and inside a sample), untiled, and tiles of all.
      const JointCase c = half_case(&rng, dtype, hv.H, hv.V, hv.act, hv.blank_last, 20, 8,
                                    {20, 13, 1, 17}, {8, 3, 0, 8});
      check_joint_half(be, report, &rng, c, {100, 0, 1000}, "");
    }
  }
  // 8 samples of 99-120 frames and 24-31 labels: 25,092 nodes. Tiles of up to 20,000 nodes, at
  // least one wave on a GPU of up to 156 SMs: the fused backward steps by whole waves.
  std::vector<int32_t> frames, labels;
  for (int b = 0; b < 8; ++b) {
    frames.push_back(120 - 3 * b);
    labels.push_back(31 - b);
  }
  const JointCase waves =
      half_case(&rng, DType::kBFloat16, 64, 129, Activation::kTanh, true, 120, 31, frames, labels);
  check_joint_half(be, report, &rng, waves, {20000}, " (waves)");
  // float32 has no fused kernel: asking for it is an error, not a silent fallback.
  JointCase c = make_joint_case(&rng, 16, 24, Activation::kTanh, 0);
  c.options.kernel = JointKernel::kFused;
  JointResult r;
  const std::vector<float> d_lattice = uniform(&rng, 3 * 5 * 4 * 2, -1, 1);
  if (std::string(be->name()) == "gpu" && !fused_only()) {
    record(report, "joint gpu float32 kernel=fused is refused",
           be->joint(c, 1000, d_lattice, &r).code == StatusCode::kInvalidArgument);
  }
}

// upload_cuda against the values uploaded: sizes from empty to beyond the staging buffers'
// first capacity, more uploads than there are buffers (so buffers are reused while earlier
// copies wait in the stream).
void test_upload(Backend* be, Report* report) {
  std::vector<std::vector<int32_t>> sources;
  for (int i = 0; i < 40; ++i) {
    const size_t n = i == 5 ? 0 : i == 11 ? 100000 : static_cast<size_t>(1 + 37 * i);
    std::vector<int32_t> source(n);
    for (size_t k = 0; k < n; ++k) source[k] = static_cast<int32_t>(1000 * i + k);
    sources.push_back(source);
  }
  std::vector<std::vector<int32_t>> copies;
  const Status st = be->upload(sources, &copies);
  bool ok = st.ok() && copies == sources;
  if (!st.ok()) std::printf("    FAIL upload: %s\n", st.message);
  for (size_t i = 0; st.ok() && i < sources.size() && i < copies.size(); ++i) {
    if (copies[i] != sources[i]) std::printf("    FAIL upload %zu: device copy differs\n", i);
  }
  record(report, "upload_cuda, 40 uploads behind 20 ms of queued work", ok);
}

void run_all(Backend* be, Report* report) {
  const bool gpu = std::string(be->name()) == "gpu";
  if (fused_only()) {
    if (gpu) test_joint_half(be, report);
    return;
  }
  test_lattice_ops(be, report);
  test_joint(be, report);
  if (gpu) test_joint_half(be, report);
  if (gpu) test_upload(be, report);
}

}  // namespace

Backend* cpu_backend() {
  static CpuBackend backend;
  return &backend;
}

#if !TF_RNNT_WITH_CUDA
Backend* gpu_backend(std::string* why) {
  *why = "built without CUDA (no nvcc)";
  return nullptr;
}
#endif

}  // namespace test
}  // namespace tf_rnnt

int main() {
  using namespace tf_rnnt::test;  // NOLINT
  Report cpu, gpu;
  std::printf("CPU launchers\n");
  run_all(cpu_backend(), &cpu);
  std::printf("CPU: %d passed, %d failed\n", cpu.passed, cpu.failed);
  std::string why;
  Backend* gpu_be = gpu_backend(&why);
  bool gpu_skipped = gpu_be == nullptr;
  if (gpu_skipped) {
    std::printf("GPU: SKIPPED (%s)\n", why.c_str());
  } else {
    std::printf("GPU launchers\n");
    run_all(gpu_be, &gpu);
    std::printf("GPU: %d passed, %d failed, %d fused-kernel cases skipped\n", gpu.passed,
                gpu.failed, gpu.fused_skipped);
  }
  const char* require = std::getenv("TF_RNNT_CORE_TEST_REQUIRE_GPU");
  const bool need_gpu = require && std::string(require) == "1";
  const char* require_fused = std::getenv("TF_RNNT_CORE_TEST_REQUIRE_FUSED");
  const bool need_fused = require_fused && std::string(require_fused) == "1";
  const bool ok = cpu.failed == 0 && gpu.failed == 0 && !(need_gpu && gpu_skipped) &&
                  !(need_fused && (gpu_skipped || gpu.fused_skipped > 0));
  std::printf("%s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
