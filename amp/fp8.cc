#include "amp/fp8.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <utility>

#include "autograd/engine.h"
#include "autograd/trace.h"
#include "tensor/ops.h"

namespace tg {
namespace amp {
namespace {

constexpr Fp8Role kRoles[] = {Fp8Role::kInput, Fp8Role::kWeight, Fp8Role::kGradOutput};

DType Fp8DTypeOf(float fp8_max) { return fp8_max == kE4M3Max ? kF8E4M3 : kF8E5M2; }

// `scale_inv` where the tile's amax is finite, NaN where it is not. A saturating cast turns an
// inf into +-max (TE's rule), which alone would hand the GEMM a finite stand-in for an overflow
// and hide it from the loss scaler's non-finite check; with the tile's scale_inv NaN, the GEMM
// outputs that read the tile are NaN, as the same GEMM in bf16 would be inf or NaN. (A NaN needs
// nothing: it casts to a NaN code, which decodes to NaN.) On the device, no host read.
RawTensor PoisonNonFinite(const RawTensor& scale_inv, const RawTensor& amax) {
  const RawTensor finite = Eq(Sub(amax, amax), RawTensor::Zeros({1}, kF32, amax.device()));
  return Where(finite, scale_inv,
               RawTensor::Full({1}, std::numeric_limits<double>::quiet_NaN(), kF32, amax.device()));
}

// A [1, 1] f32 tensor holding `value` on `device` (the per-tensor scale grid).
RawTensor ScalarGrid(float value, Device device) {
  return RawTensor::FromVector<float>({value}, {1, 1}).to(device);
}

}  // namespace

const char* Fp8RecipeName(Fp8Recipe recipe) {
  switch (recipe) {
    case Fp8Recipe::kDelayed:
      return "delayed";
    case Fp8Recipe::kCurrent:
      return "current";
    case Fp8Recipe::kBlock:
      return "block";
  }
  return "?";
}

Fp8Recipe ParseFp8Recipe(const std::string& name) {
  for (Fp8Recipe r : {Fp8Recipe::kDelayed, Fp8Recipe::kCurrent, Fp8Recipe::kBlock}) {
    if (name == Fp8RecipeName(r)) return r;
  }
  throw Error(absl::StrCat("FP8 recipe '", name, "': expected delayed, current or block"));
}

// The quantizer of one (layer, role). It reaches its Fp8Training through `owner`, which the
// training clears when it is destroyed, so a graph that outlives it fails clearly.
class Fp8Training::Quantizer final : public Fp8Quantizer {
 public:
  Quantizer(std::shared_ptr<Fp8Training*> owner, int64_t layer, Fp8Role role)
      : owner_(std::move(owner)), layer_(layer), role_(role) {}

  Fp8Quantized Quantize(const RawTensor& x, bool rowwise, bool columnwise) override {
    Fp8Training* t = *owner_;
    TG_CHECK(t != nullptr, "FP8 quantizer (layer ", layer_, ", ", Fp8RoleName(role_),
             "): its Fp8Training was destroyed before this cast (a backward of a graph "
             "recorded under it?)");
    const float fp8_max = Fp8Max(t->format_, role_);
    const DType dtype = Fp8DTypeOf(fp8_max);
    switch (t->options_.recipe) {
      case Fp8Recipe::kDelayed:
        return Delayed(*t, x, dtype, columnwise);
      case Fp8Recipe::kCurrent:
      case Fp8Recipe::kBlock:
        break;
    }
    Fp8ScaleOptions o;
    o.fp8_max = fp8_max;
    o.amax_epsilon = t->options_.amax_epsilon;
    const bool block = t->options_.recipe == Fp8Recipe::kBlock;
    o.force_pow_2_scales = t->options_.force_pow_2_scales.value_or(block);
    o.value_for_inf = ValueForInf(x.dtype());
    if (!block) {
      Fp8Quantized q;
      const RawTensor amax = Fp8Amax(x, Fp8Tiling::kTensor);
      const Fp8Scales s = Fp8ScaleFromAmax(amax, o);
      const Fp8CastResult r = Fp8Cast(x, s.scale, Fp8Tiling::kTensor, dtype, columnwise);
      last_scale_ = s.scale;
      TraceCast(*t, "per tensor");
      const RawTensor scale_inv = PoisonNonFinite(s.scale_inv, amax);
      if (rowwise) q.rowwise = {r.data, scale_inv, Fp8Tiling::kTensor};
      if (columnwise) q.columnwise = {r.data_t, scale_inv, Fp8Tiling::kTensor};
      return q;
    }
    if (role_ == Fp8Role::kWeight) {
      // 128x128 blocks: the transposed blocks are the blocks of the transpose, so one cast gives
      // both operands, the scale grid transposed with them.
      const RawTensor amax = Fp8Amax(x, Fp8Tiling::k128x128);
      const Fp8Scales s = Fp8ScaleFromAmax(amax, o);
      const Fp8CastResult r = Fp8Cast(x, s.scale, Fp8Tiling::k128x128, dtype, columnwise);
      last_scale_ = s.scale;
      TraceCast(*t, "128x128 blocks");
      const RawTensor scale_inv = PoisonNonFinite(s.scale_inv, amax);
      Fp8Quantized q;
      if (rowwise) q.rowwise = {r.data, scale_inv, Fp8Tiling::k128x128};
      if (columnwise) {
        q.columnwise = {r.data_t, scale_inv.transpose(0, 1).contiguous(), Fp8Tiling::k128x128};
      }
      return q;
    }
    // 1x128 tiles run along the contraction of each GEMM: the transposed operand is cast from
    // the transposed tensor with tiles of its own.
    Fp8Quantized q;
    if (rowwise) q.rowwise = Tiles1x128(x, o, dtype);
    if (columnwise) q.columnwise = Tiles1x128(x.transpose(0, 1).contiguous(), o, dtype);
    TraceCast(*t, "1x128 tiles");
    return q;
  }

  // The event trace's record of a current or block cast: its scales, read on the host only
  // while tracing (a synchronisation on a device; nothing when tracing is off).
  void TraceCast(const Fp8Training& t, const char* tiles) const {
    if (!TracingEnabled()) return;
    const std::vector<float> s = last_scale_.to_vector<float>();
    if (s.empty()) return;
    const auto [lo, hi] = std::minmax_element(s.begin(), s.end());
    TraceEvent("fp8", "cast layer ", layer_, " ", Fp8RoleName(role_), " (",
               Fp8RecipeName(t.options_.recipe), ", ", tiles, "): scale in [", *lo, ", ", *hi, "]");
  }

  // Delayed scaling: the forward amax recorded since the last update (undefined: none).
  RawTensor TakeAmax() {
    RawTensor amax = std::move(amax_);
    amax_.reset();
    return amax;
  }
  const RawTensor& last_scale() const { return last_scale_; }

 private:
  // The largest finite value of x's dtype: what an overflowing scale becomes (TE's
  // value_for_inf is the input type's max).
  static float ValueForInf(DType dtype) {
    return dtype == kF16 ? 65504.0f : std::numeric_limits<float>::max();
  }

  Fp8Operand Tiles1x128(const RawTensor& x, const Fp8ScaleOptions& o, DType dtype) {
    const RawTensor amax = Fp8Amax(x, Fp8Tiling::k1x128);
    const Fp8Scales s = Fp8ScaleFromAmax(amax, o);
    const Fp8CastResult r = Fp8Cast(x, s.scale, Fp8Tiling::k1x128, dtype);
    last_scale_ = s.scale;
    return {r.data, PoisonNonFinite(s.scale_inv, amax), Fp8Tiling::k1x128};
  }

  Fp8Quantized Delayed(Fp8Training& t, const RawTensor& x, DType dtype, bool columnwise) {
    const Device device = x.device();
    if (generation_ != t.generation_ || !scale_.defined() || scale_.device() != device) {
      const Fp8TensorScaling& s = t.delayed_->tensor(layer_, role_);
      scale_ = ScalarGrid(s.scale, device);
      scale_inv_ = ScalarGrid(s.scale_inv(), device);
      generation_ = t.generation_;
    }
    const Fp8CastResult r =
        Fp8Cast(x, scale_, Fp8Tiling::kTensor, dtype, columnwise, /*amax=*/true);
    // A weight used by two Linears in one pass records the larger amax.
    amax_ = amax_.defined() ? Maximum(amax_, r.amax) : r.amax;
    last_scale_ = scale_;
    if (role_ == Fp8Role::kGradOutput) t.QueueBackwardUpdate(owner_);
    const RawTensor scale_inv = PoisonNonFinite(scale_inv_, r.amax);
    Fp8Quantized q;
    q.rowwise = {r.data, scale_inv, Fp8Tiling::kTensor};
    if (columnwise) q.columnwise = {r.data_t, scale_inv, Fp8Tiling::kTensor};
    return q;
  }

  std::shared_ptr<Fp8Training*> owner_;
  int64_t layer_;
  Fp8Role role_;
  RawTensor scale_, scale_inv_;  // delayed: the recipe's scale on the device, for generation_
  int64_t generation_ = -1;
  RawTensor amax_;        // delayed: this pass's amax
  RawTensor last_scale_;  // the scale (grid) of the latest cast
};

Fp8Training::Fp8Training(std::vector<Tensor> weights, const Fp8TrainingOptions& options)
    : options_(options),
      format_(options.format.value_or(options.recipe == Fp8Recipe::kBlock ? Fp8Format::kE4M3
                                                                          : Fp8Format::kHybrid)),
      weights_(std::move(weights)),
      owner_(std::make_shared<Fp8Training*>(this)) {
  static constexpr char kOp[] = "Fp8Training: ";
  TG_CHECK(format_ != Fp8Format::kE5M2, kOp,
           "E5M2 as the format is not supported (as in Transformer Engine: pure E5M2 training); "
           "use E4M3 or HYBRID");
  TG_CHECK(std::isfinite(options.amax_epsilon) && options.amax_epsilon >= 0.0f, kOp,
           "amax_epsilon must be finite and >= 0, got ", options.amax_epsilon);
  for (size_t i = 0; i < weights_.size(); ++i) {
    const Tensor& w = weights_[i];
    TG_CHECK(w.defined(), kOp, "weight ", i, " is undefined");
    TG_CHECK(w.dim() == 2, kOp, "weight ", i, " must be 2-D [out, in], got shape ",
             ShapeToString(w.shape()));
    TG_CHECK(layer_of_.emplace(w.impl().get(), static_cast<int64_t>(i)).second, kOp, "weight ", i,
             " is weight ", layer_of_.at(w.impl().get()), " again");
  }
  if (options_.recipe == Fp8Recipe::kDelayed) {
    Fp8DelayedScalingOptions d = options_.delayed;
    d.format = format_;
    delayed_ = std::make_unique<Fp8DelayedScaling>(num_layers(), d);
  }
  for (int64_t layer = 0; layer < num_layers(); ++layer) {
    for (Fp8Role role : kRoles) {
      quantizers_.push_back(std::make_shared<Quantizer>(owner_, layer, role));
    }
  }
}

Fp8Training::~Fp8Training() { *owner_ = nullptr; }

std::optional<Fp8LinearQuantizers> Fp8Training::LinearQuantizers(const Tensor& weight) {
  if (!weight.defined()) return std::nullopt;
  const auto it = layer_of_.find(weight.impl().get());
  if (it == layer_of_.end()) return std::nullopt;
  const size_t base = static_cast<size_t>(it->second) * 3;
  return Fp8LinearQuantizers{quantizers_[base], quantizers_[base + 1], quantizers_[base + 2]};
}

void Fp8Training::QueueBackwardUpdate(const std::shared_ptr<Fp8Training*>& owner) {
  const int64_t task = outermost_graph_task_id();
  if (task < 0 || task == backward_task_) return;  // outside backward, or queued already
  backward_task_ = task;
  queue_callback_on_outermost_task(
      [owner] {
        if (*owner != nullptr) (*owner)->FinishBackward();
      },
      "fp8 backward update");
}

void Fp8Training::Update(bool forward) {
  if (delayed_ == nullptr) return;
  const std::vector<Fp8Role> roles = forward
                                         ? std::vector<Fp8Role>{Fp8Role::kInput, Fp8Role::kWeight}
                                         : std::vector<Fp8Role>{Fp8Role::kGradOutput};
  // The pass's amaxes gathered on their device into one buffer (0 for a layer that did not
  // run), then one host read: one synchronisation per pass on a GPU, not one per tensor.
  const int64_t count = static_cast<int64_t>(roles.size()) * num_layers();
  std::vector<RawTensor> pending;
  pending.reserve(static_cast<size_t>(count));
  RawTensor buffer;
  for (int64_t layer = 0; layer < num_layers(); ++layer) {
    for (Fp8Role role : roles) {
      pending.push_back(quantizers_[layer * 3 + static_cast<int>(role)]->TakeAmax());
      if (!buffer.defined() && pending.back().defined()) {
        buffer = RawTensor::Zeros({count}, kF32, pending.back().device());
      }
    }
  }
  std::vector<float> amaxes(static_cast<size_t>(count), 0.0f);
  if (buffer.defined()) {
    for (int64_t i = 0; i < count; ++i) {
      if (pending[i].defined()) buffer.narrow(0, i, 1).copy_(pending[i].reshape({1}));
    }
    amaxes = buffer.to_vector<float>();
  }
  const Fp8DelayedScaling::AmaxReducer& reduce = reducer_;
  if (forward) {
    delayed_->UpdateForward(amaxes, reduce);
  } else {
    delayed_->UpdateBackward(amaxes, reduce);
  }
  ++generation_;
  if (TracingEnabled()) {
    for (Fp8Role role : roles) {
      const Fp8RoleSummary s = Summary(role);
      TraceEvent("fp8", forward ? "forward" : "backward", " update (delayed): ", Fp8RoleName(role),
                 " scales in [", s.min_scale, ", ", s.max_scale, "] over ", num_layers(),
                 " layers");
    }
  }
}

constexpr const char* kForwardUpdateOwed =
    "amp::Fp8Autocast: a forward's FP8 update did not run: call Finish() on the Fp8Autocast at "
    "the end of the forward (or Fp8Training::FinishForward() after its scope)";

void Fp8Training::FinishForward() {
  forward_update_owed_ = false;
  Update(/*forward=*/true);
}

void Fp8Training::FinishBackward() {
  backward_task_ = -1;
  TG_CHECK(!forward_update_owed_, kForwardUpdateOwed);
  Update(/*forward=*/false);
}

void Fp8Training::DiscardPending() {
  for (const auto& q : quantizers_) q->TakeAmax();
}

Fp8RoleSummary Fp8Training::Summary(Fp8Role role) const {
  Fp8RoleSummary s;
  bool any = false;
  const auto add = [&](float v) {
    s.min_scale = any ? std::min(s.min_scale, v) : v;
    s.max_scale = any ? std::max(s.max_scale, v) : v;
    any = true;
  };
  for (int64_t layer = 0; layer < num_layers(); ++layer) {
    if (delayed_ != nullptr) {
      add(delayed_->scale(layer, role));
      continue;
    }
    const RawTensor& last = quantizers_[layer * 3 + static_cast<int>(role)]->last_scale();
    if (!last.defined()) continue;
    for (float v : last.to_vector<float>()) add(v);
  }
  return s;
}

StateDict Fp8Training::state_dict() const {
  StateDict sd;
  sd.scalars["recipe"] = static_cast<double>(options_.recipe);
  sd.scalars["format"] = static_cast<double>(format_);
  sd.scalars["num_layers"] = static_cast<double>(num_layers());
  if (delayed_ != nullptr) sd.Merge("delayed.", delayed_->state_dict());
  return sd;
}

void Fp8Training::load_state_dict(const StateDict& state) {
  static constexpr char kOp[] = "Fp8Training::load_state_dict: ";
  const StateDict reference = state_dict();
  for (const auto& [key, value] : state.scalars) {
    TG_CHECK(reference.has_scalar(key), kOp, "unexpected scalar '", key, "'");
  }
  for (const auto& [key, value] : state.tensors) {
    TG_CHECK(reference.has_tensor(key), kOp, "unexpected tensor '", key, "'");
  }
  const double recipe = state.scalar("recipe");
  TG_CHECK(recipe == reference.scalar("recipe"), kOp, "the checkpoint's recipe is ",
           recipe == 0 || recipe == 1 || recipe == 2
               ? Fp8RecipeName(static_cast<Fp8Recipe>(static_cast<int>(recipe)))
               : absl::StrCat("the unknown code ", recipe).c_str(),
           ", this run's is ", Fp8RecipeName(options_.recipe));
  TG_CHECK(state.scalar("format") == reference.scalar("format"), kOp,
           "the checkpoint's format code is ", state.scalar("format"), ", this run's is ",
           reference.scalar("format"), " (", Fp8FormatName(format_), ")");
  TG_CHECK(state.scalar("num_layers") == reference.scalar("num_layers"), kOp, "the checkpoint has ",
           state.scalar("num_layers"), " FP8 layers, this run has ", num_layers());
  if (delayed_ != nullptr) delayed_->load_state_dict(state.Sub("delayed."));  // all or nothing
  DiscardPending();
  ++generation_;
}

// `training`, once it owes no forward update (a new forward must not start before the last
// one's update).
Fp8Training* Fp8Autocast::NothingOwed(Fp8Training* training) {
  TG_CHECK(training == nullptr || !training->forward_update_owed_, kForwardUpdateOwed);
  return training;
}

Fp8Autocast::Fp8Autocast(Fp8Training* training, bool update)
    : training_(training),
      guard_(NothingOwed(training)),
      update_(update),
      uncaught_(std::uncaught_exceptions()) {}

void Fp8Autocast::Finish() {
  TG_CHECK(update_, "amp::Fp8Autocast::Finish: this scope was made with update = false");
  TG_CHECK(!finished_, "amp::Fp8Autocast::Finish: called twice in one scope");
  finished_ = true;
  if (training_ != nullptr) training_->FinishForward();
}

Fp8Autocast::~Fp8Autocast() {
  // While an exception leaves the scope no update is owed: the amaxes of the casts that did run
  // stay recorded and join the next update's.
  if (training_ == nullptr || std::uncaught_exceptions() != uncaught_) return;
  if (!update_) {
    training_->DiscardPending();
  } else if (!finished_) {
    training_->forward_update_owed_ = true;
  }
}

}  // namespace amp
}  // namespace tg
