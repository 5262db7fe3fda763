// Mixed-precision step costs for 10^7 parameters on the CPU, against the targets of the AMP issue:
// the fused non-finite check + unscale and the master-weight AdamW step should move memory at
// >= 50% of the copy bandwidth measured in the same run (a plain memcpy moving the same number of
// bytes), and are compared with their per-tensor unfused versions.
//
// The parameters are ~10^7 f32/f16 elements split like a small GPT (8 blocks of d = 256 plus a
// token embedding: 99 tensors from 256 to 3.7M elements). Bandwidths count the bytes an operation
// must touch (reads + writes, each once); the unfused versions are charged the same bytes, so
// their GB/s ratio is their speed ratio. Every run starts with cold caches. memcpy writes a
// separate destination (which the CPU also reads, write-allocate), so an in-place update of the
// same counted bytes can exceed x1.00 of copy.
//
//   bazel run -c opt //tools/bench:amp_step
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "amp/mixed_precision_optimizer.h"
#include "autograd/variable.h"
#include "optim/adam.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace {

using Clock = std::chrono::steady_clock;

// A timed case: `run` is timed; `setup` (if any) runs untimed before it.
struct Case {
  std::function<void()> run;
  std::function<void()> setup = nullptr;
};

// Evicts the caches (the last-level cache of a server CPU can hold 100 MB, i.e. most of the 40 MB
// of f32 gradients): every timed run starts cold, streaming from memory like the memcpy baseline.
void EvictCaches() {
  static std::vector<char> buffer(size_t{256} << 20);
  static char value = 0;
  std::memset(buffer.data(), ++value, buffer.size());
}

// The best time of each case in seconds, measured round-robin: `rounds` rounds that run every
// case once, after one untimed warm-up round, so that a change in machine load (other processes
// on a shared machine) affects all of them alike. Caches are evicted before each run.
std::vector<double> BestSeconds(int rounds, const std::vector<Case>& cases) {
  std::vector<double> best(cases.size(), 1e30);
  for (int round = 0; round <= rounds; ++round) {
    for (size_t c = 0; c < cases.size(); ++c) {
      if (cases[c].setup) cases[c].setup();
      EvictCaches();
      const auto start = Clock::now();
      cases[c].run();
      const double s = std::chrono::duration<double>(Clock::now() - start).count();
      if (round > 0) best[c] = std::min(best[c], s);
    }
  }
  return best;
}

// The parameter shapes of a small GPT: 8 blocks of d = 256 (layer norms, qkv, projection, MLP
// with biases), a final layer norm and a [14380, 256] token embedding: 99 tensors, ~10^7 elements.
std::vector<tg::Shape> ModelShapes() {
  const int64_t d = 256;
  std::vector<tg::Shape> shapes = {{14380, d}};
  for (int layer = 0; layer < 8; ++layer) {
    const std::vector<tg::Shape> block = {{d}, {d}, {3 * d, d}, {3 * d}, {d, d},     {d},
                                          {d}, {d}, {4 * d, d}, {4 * d}, {d, 4 * d}, {d}};
    shapes.insert(shapes.end(), block.begin(), block.end());
  }
  shapes.push_back({d});
  shapes.push_back({d});
  return shapes;
}

struct Row {
  const char* name;
  double seconds;
  double bytes;
};

double PrintBaseline(const char* name, double seconds, double bytes) {
  const double gbs = bytes / seconds * 1e-9;
  std::printf("  %-58s %8.2f ms %7.2f GB/s  (baseline)\n", name, seconds * 1e3, gbs);
  return gbs;
}

void Print(const Row& row, double copy_gbs, double unfused_seconds = 0) {
  const double gbs = row.bytes / row.seconds * 1e-9;
  std::printf("  %-58s %8.2f ms %7.2f GB/s  x%.2f of copy", row.name, row.seconds * 1e3, gbs,
              gbs / copy_gbs);
  if (unfused_seconds > 0) std::printf("  x%.1f vs unfused", unfused_seconds / row.seconds);
  std::printf("\n");
}

// A MixedPrecisionOptimizer around AdamW over f16 copies of `init` (f32), with master grads made
// from `grads` (f16, as if scaled by 65536) through update_master_grads().
struct AmpModel {
  std::vector<tg::Tensor> params;  // f16
  std::unique_ptr<tg::amp::MixedPrecisionOptimizer> opt;

  AmpModel(const std::vector<tg::RawTensor>& init, const std::vector<tg::RawTensor>& grads,
           bool fused) {
    for (const tg::RawTensor& t : init) params.emplace_back(t.to(tg::kF16), /*requires_grad=*/true);
    tg::optim::AdamWOptions o;
    o.lr(1e-3);
    o.fused(fused);
    opt = std::make_unique<tg::amp::MixedPrecisionOptimizer>(
        std::make_unique<tg::optim::AdamW>(params, o));
    for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(tg::Tensor(grads[i]));
    opt->update_master_grads();  // master grads = f32(grad) / 65536; stay until zero_grad()
  }
};

}  // namespace

int main() {
  tg::Generator gen(0);
  const std::vector<tg::Shape> shapes = ModelShapes();
  std::vector<tg::RawTensor> init, grads16, master_grads;
  int64_t n = 0, smallest = 1 << 30, largest = 0;
  for (const tg::Shape& s : shapes) {
    init.push_back(tg::RandNormal(s, gen, 0.0, 0.02));
    grads16.push_back(tg::RandNormal(s, gen, 0.0, 1.0, tg::kF16));  // scaled f16 gradients
    master_grads.push_back(tg::RandNormal(s, gen));                 // f32, for (b)
    n += master_grads.back().numel();
    smallest = std::min(smallest, master_grads.back().numel());
    largest = std::max(largest, master_grads.back().numel());
  }
  std::printf("amp_step: %lld parameters in %zu tensors (%lld .. %lld elements)\n",
              static_cast<long long>(n), shapes.size(), static_cast<long long>(smallest),
              static_cast<long long>(largest));
  std::printf(
      "GB/s of memory traffic (bytes read + written, each once); targets: >= x0.50 of copy\n");

  // (a) memcpy baselines moving the same byte counts as (b) and (c): read once, written once.
  const double unscale_bytes = 8.0 * n;  // (b): read 4 B + write 4 B per element
  const double step_bytes = 30.0 * n;    // (c): see below
  std::vector<char> src(static_cast<size_t>(step_bytes / 2), 1), dst(src.size(), 0);
  auto memcpy_case = [&](double traffic_bytes) {
    return Case{[&, traffic_bytes] {
      std::memcpy(dst.data(), src.data(), static_cast<size_t>(traffic_bytes / 2));
    }};
  };

  // (b) Non-finite check + unscale of the f32 master grads, fused (one pass over all tensors)
  // and per tensor (AnyNonFinite, then a scale: two passes).
  const tg::RawTensor found_inf = tg::RawTensor::Zeros({}, tg::kF32);
  // Alternating 1/2 and 2 keeps the values (exactly) where they started, whatever the rep count.
  const tg::RawTensor halve = tg::RawTensor::Scalar(0.5), twice = tg::RawTensor::Scalar(2.0);
  int flip = 0;
  bool any_inf = false;
  std::vector<tg::RawTensor> out_of_place = master_grads;
  const std::vector<double> b =
      BestSeconds(20, {memcpy_case(unscale_bytes),
                       {[&] {
                         tg::NonFiniteCheckAndUnscale(master_grads, found_inf,
                                                      (flip++ % 2 == 0) ? halve : twice);
                       }},
                       {[&] {
                         const double s = (flip++ % 2 == 0) ? 0.5 : 2.0;
                         for (const tg::RawTensor& g : master_grads) {
                           any_inf = tg::AnyNonFinite({g}) || any_inf;
                           tg::MulScalarInPlace({g}, s);
                         }
                       }},
                       {[&] {
                         const double s = (flip++ % 2 == 0) ? 0.5 : 2.0;
                         for (tg::RawTensor& g : out_of_place) {
                           any_inf = tg::AnyNonFinite({g}) || any_inf;
                           g = tg::MulScalar(g, s);
                         }
                       }}});
  out_of_place.clear();
  std::printf("\nnon-finite check + unscale, f32 grads (8 B/element)\n");
  const double copy_b = PrintBaseline("memcpy (4 B/element: same traffic)", b[0], unscale_bytes);
  Print({"NonFiniteCheckAndUnscale (fused, one pass, 99 tensors)", b[1], unscale_bytes}, copy_b,
        b[2]);
  Print({"per tensor: AnyNonFinite + MulScalarInPlace (2 passes)", b[2], unscale_bytes}, copy_b);
  Print({"per tensor: AnyNonFinite + MulScalar (out of place)", b[3], unscale_bytes}, copy_b);
  if (any_inf || found_inf.item() != 0) std::printf("  (unexpected: found inf)\n");

  // (c) The master-weight AdamW step: read grad, m, v, master (4 B each); write m, v, master
  // (4 B each) and the f16 parameter (2 B): 30 B per element. Its two parts are timed too: the
  // wrapped AdamW on the masters alone (28 B/element) and the copy back to the f16 parameters
  // (read 4 B, write 2 B); and update_master_grads(), which makes the master grads from a
  // backward's f16 .grad: f16 -> f32 (read 2 B, write 4 B), then the fused check and unscale
  // (8 B): 14 B per element.
  AmpModel fused(init, grads16, /*fused=*/true);
  AmpModel unfused(init, grads16, /*fused=*/false);
  tg::amp::MixedPrecisionOptimizer& opt = *fused.opt;
  const std::vector<tg::RawTensor> mg = *opt.inspect_master_grads();
  const std::vector<tg::Tensor>& masters = opt.master_params();
  auto step = [](tg::amp::MixedPrecisionOptimizer& o) {
    if (o.step().skipped) std::printf("  (unexpected: skipped step)\n");
  };
  const std::vector<double> c =
      BestSeconds(8, {memcpy_case(step_bytes),
                      {[&] { step(opt); }},
                      {[&] { step(*unfused.opt); }},
                      {[&] { opt.optimizer().step(); },
                       [&] {
                         // step() registers the f16 parameters as model copies: unregister them
                         // so that this case updates the masters alone.
                         for (size_t i = 0; i < masters.size(); ++i) {
                           masters[i].set_grad(tg::Tensor(mg[i]));
                           opt.optimizer().set_model_copy(masters[i], tg::RawTensor());
                         }
                       }},
                      {[&] {
                        for (size_t i = 0; i < masters.size(); ++i) {
                          opt.model_params()[i].data().copy_(masters[i].data());
                        }
                      }},
                      {[&] { unfused.opt->update_master_grads(); },
                       [&] {
                         unfused.opt->zero_grad();
                         for (size_t i = 0; i < unfused.params.size(); ++i) {
                           unfused.params[i].set_grad(tg::Tensor(grads16[i]));
                         }
                       }}});
  for (const tg::Tensor& m : masters) m.set_grad(tg::Tensor());
  std::printf(
      "\nMixedPrecisionOptimizer::step(): AdamW on f32 masters of f16 params (30 B/element)\n");
  const double copy_c = PrintBaseline("memcpy (15 B/element: same traffic)", c[0], step_bytes);
  Print({"step(), AdamW fused=true (multi-tensor)", c[1], step_bytes}, copy_c, c[2]);
  Print({"step(), AdamW fused=false (per-tensor composed ops)", c[2], step_bytes}, copy_c);
  std::printf("  parts of the fused step:\n");
  Print({"  AdamW fused step on the f32 masters alone (28 B/element)", c[3], 28.0 * n}, copy_c);
  Print({"  copy back f32 masters -> f16 params (6 B/element)", c[4], 6.0 * n}, copy_c);
  std::printf("\nupdate_master_grads(): f16 .grad -> f32 master grads, fused check + unscale\n");
  Print({"update_master_grads() (14 B/element)", c[5], 14.0 * n}, copy_c);
  return 0;
}
