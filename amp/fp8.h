// FP8 training: the Linear layers of a model run their three GEMMs on FP8 operands, cast with one
// of Transformer Engine's scaling recipes (amp/fp8_recipe.h has their exact rules), while the
// outputs, master weights, gradients and optimizer state stay as mixed precision has them.
//
//   tg::amp::Fp8TrainingOptions o;
//   o.recipe = tg::amp::Fp8Recipe::kDelayed;               // or kCurrent, kBlock
//   tg::amp::Fp8Training fp8(tg::nn::LinearWeights(*model), o);
//   for (...) {
//     tg::Tensor loss;
//     {
//       tg::amp::AutocastGuard autocast(tg::kBF16);        // FP8 sits inside bf16 autocast
//       tg::amp::Fp8Autocast on(fp8);                      // TE's fp8_autocast
//       loss = model.forward(x, y);
//     }                                                    // delayed: forward scales update
//     optimizer.backward(loss);                            // delayed: grad scales update after it
//     optimizer.step();
//   }
//
// Layers are the covered weights, in the order given (layer i = weights[i]); a Linear whose
// weight is not among them runs as before. Inside an Fp8Autocast, Linear (the op list's
// Fp8Policy::kGemm) asks this object for the weight's quantizers (autograd/fp8.h):
//   delayed  one scale per layer and role from its amax history (E4M3 forward; E5M2 gradients in
//            the HYBRID format); each cast records its tensor's amax in the same pass; at the
//            guard's exit the forward amaxes (input, weight per layer) are reduced across
//            data-parallel ranks (set_amax_reducer: one all-reduce MAX of all of them) and the
//            scales move; after each backward (an engine callback on the outermost graph task)
//            the grad_output amaxes do the same. One host read of the amaxes per pass.
//   current  each cast's scale comes from that tensor's amax in this pass (an amax pass, then the
//            cast, both on the device: no host read); nothing carries over between steps.
//   block    as current, per tile: 1x128 tiles for inputs and gradients (their transposed
//            operands are cast from the transposed tensor, so tiles run along each GEMM's
//            contraction), 128x128 blocks for weights; power-of-two scales (TE's default).
// Non-finite values: a saturating cast turns inf into +-max; so that no overflow reaches the
// optimizer as a finite number, a tile (or tensor) whose amax is not finite gets a NaN scale_inv,
// and the GEMM outputs that read it are NaN (the mixed-precision optimizer then skips the step).
// Current and block scaling have no state that moves, hence nothing to reduce: activations and
// gradients use their own rank's amax (as in TE, whose amax reduction for these recipes is over
// the tensor-parallel group only), and weights are identical on every rank.
//
// Checkpoints: state_dict() holds the recipe ("fp8.recipe": 0 delayed, 1 current, 2 block) and,
// for delayed scaling, every layer's scales and amax histories; load_state_dict() refuses another
// recipe or layer count and changes nothing, and a restored run continues bit-identically.
// Activation checkpointing inside an FP8 scope is refused (autograd/checkpoint.cc).
#ifndef TAPEGRAD_AMP_FP8_H_
#define TAPEGRAD_AMP_FP8_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "amp/fp8_recipe.h"
#include "autograd/fp8.h"
#include "autograd/variable.h"
#include "tensor/state_dict.h"

namespace tg {
namespace amp {

enum class Fp8Recipe { kDelayed = 0, kCurrent = 1, kBlock = 2 };

const char* Fp8RecipeName(Fp8Recipe recipe);  // "delayed", "current", "block"
// "delayed", "current" or "block"; anything else throws tg::Error naming the value.
Fp8Recipe ParseFp8Recipe(const std::string& name);

struct Fp8TrainingOptions {
  Fp8Recipe recipe = Fp8Recipe::kDelayed;
  // E4M3 or HYBRID (E5M2 for gradients); unset: TE's default for the recipe (HYBRID for delayed
  // and current scaling, E4M3 for block scaling).
  std::optional<Fp8Format> format;
  // Delayed scaling: margin, amax_history_len, amax_compute_algo, reduce_amax (its `format`
  // field is replaced by the one above).
  Fp8DelayedScalingOptions delayed;
  // Current and block scaling: amax_epsilon and force_pow_2_scales (unset: off for current,
  // on for block, TE's defaults).
  float amax_epsilon = 0.0f;
  std::optional<bool> force_pow_2_scales;
};

// The scales of one role over the layers, for metrics (Summary).
struct Fp8RoleSummary {
  float min_scale = 0.0f;  // the tightest layer (or tile); 0 before any cast
  float max_scale = 0.0f;
};

class Fp8Training final : public Fp8Scope {
 public:
  // Throws tg::Error for an undefined or repeated weight, a weight that is not 2-D, E5M2 as the
  // format, or invalid recipe options (named with their values).
  Fp8Training(std::vector<Tensor> weights, const Fp8TrainingOptions& options = {});
  ~Fp8Training() override;

  Fp8Recipe recipe() const { return options_.recipe; }
  Fp8Format format() const { return format_; }
  int64_t num_layers() const { return static_cast<int64_t>(weights_.size()); }

  // The all-reduce MAX of the data-parallel group (delayed scaling with reduce_amax): called
  // once per update on all of the pass's amaxes, on every rank in the same order.
  void set_amax_reducer(Fp8DelayedScaling::AmaxReducer reducer) { reducer_ = std::move(reducer); }

  // Fp8Scope: the quantizers of a covered weight (matched by identity), else nullopt.
  std::optional<Fp8LinearQuantizers> LinearQuantizers(const Tensor& weight) override;

  // Delayed scaling's updates (no-ops for the other recipes); Fp8Autocast::Finish and the
  // backward callback call them, tests may too. FinishBackward throws while a forward's update
  // is owed (see Fp8Autocast).
  void FinishForward();
  void FinishBackward();
  // Drops the amaxes recorded since the last update (a forward that must not move the scales:
  // evaluation, sampling).
  void DiscardPending();

  // The delayed recipe's state, for the scales it will use next (nullptr for current/block).
  const Fp8DelayedScaling* delayed() const { return delayed_.get(); }

  // Per role (input, weight, grad_output): the scales of the latest casts (delayed: the scales
  // the next casts use). Reads device values (one host read per role) for current and block.
  Fp8RoleSummary Summary(Fp8Role role) const;

  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  class Quantizer;
  friend class Quantizer;

  // Delayed scaling: the pass's amaxes (one host read each), reduced, then the recipe's update.
  void Update(bool forward);
  // Queues FinishBackward on the running backward's outermost task (once per backward).
  void QueueBackwardUpdate(const std::shared_ptr<Fp8Training*>& owner);

  Fp8TrainingOptions options_;
  Fp8Format format_;
  std::vector<Tensor> weights_;
  // Cleared by the destructor: the quantizers (kept alive by recorded graphs) see it.
  std::shared_ptr<Fp8Training*> owner_;
  std::unordered_map<const void*, int64_t> layer_of_;   // weight's impl -> layer
  std::vector<std::shared_ptr<Quantizer>> quantizers_;  // [layer * 3 + role]
  std::unique_ptr<Fp8DelayedScaling> delayed_;
  Fp8DelayedScaling::AmaxReducer reducer_;
  int64_t generation_ = 0;      // bumped by every update: the quantizers' device scales refresh
  int64_t backward_task_ = -1;  // the graph task whose end runs FinishBackward
  bool forward_update_owed_ = false;  // an Fp8Autocast scope ended without its update
  friend class Fp8Autocast;
};

// TE's fp8_autocast: installs `training` on this thread for the guard's lifetime (enabled =
// false installs none, so Linears inside run as usual). The forward's update is an explicit call,
// Finish(), at the end of the forward (TE runs it at the scope's exit; here it may throw, a
// reducer's error, which a destructor must not):
//
//   {
//     tg::amp::Fp8Autocast on(fp8);
//     loss = model(x);
//     on.Finish();  // delayed scaling's forward update (a no-op for the other recipes)
//   }
//
// A scope with update = true that ends without Finish() (and without an exception leaving it)
// leaves the update owed: the next Fp8Autocast over the same training, and the backward's
// update, throw tg::Error saying so, so a missing update is never silent; calling
// training.FinishForward() after the scope pays it too. With update = false the scope's exit
// drops the amaxes it recorded (evaluation: the casts use the scales, which stay as they are).
// When an exception leaves the scope, the amaxes of the casts that did run join the next update.
// The destructor never throws, so the guard may live in a std::optional. A null training (the
// pointer form) installs none, for code whose FP8 is optional.
class Fp8Autocast {
 public:
  explicit Fp8Autocast(Fp8Training& training, bool enabled = true, bool update = true)
      : Fp8Autocast(enabled ? &training : nullptr, update) {}
  explicit Fp8Autocast(Fp8Training* training, bool update = true);
  ~Fp8Autocast();
  Fp8Autocast(const Fp8Autocast&) = delete;
  Fp8Autocast& operator=(const Fp8Autocast&) = delete;

  // The forward's update (training.FinishForward()); once per scope, with update = true.
  void Finish();

 private:
  static Fp8Training* NothingOwed(Fp8Training* training);

  Fp8Training* training_;
  Fp8ScopeGuard guard_;
  bool update_;
  bool finished_ = false;
  int uncaught_;
};

}  // namespace amp
}  // namespace tg

#endif  // TAPEGRAD_AMP_FP8_H_
