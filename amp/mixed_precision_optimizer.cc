#include "amp/mixed_precision_optimizer.h"

#include <string>
#include <utility>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "autograd/trace.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace tg {
namespace amp {
namespace {

constexpr const char* kName = "MixedPrecisionOptimizer";

bool IsLowPrecision(DType dtype) { return dtype == kF16 || dtype == kBF16; }

}  // namespace

MixedPrecisionOptimizer::MixedPrecisionOptimizer(std::unique_ptr<optim::Optimizer> optimizer,
                                                 Options options)
    : optimizer_(std::move(optimizer)) {
  TG_CHECK(optimizer_ != nullptr, kName, ": the optimizer is null");
  TG_CHECK(!optimizer_->has_state(), kName,
           ": the wrapped optimizer already has state; wrap it before its first step (its "
           "parameters are replaced by f32 masters)");
  bool any_f16 = false;
  for (optim::ParamGroup& group : optimizer_->param_groups()) {
    for (Tensor& p : group.params) {
      if (model_.empty()) device_ = p.data().device();
      TG_CHECK(p.data().device() == device_, kName, ": parameter ", model_.size(), " is on ",
               p.data().device().ToString(), " but parameter 0 is on ", device_.ToString(),
               "; move the whole model to one device (Module::to) before making the optimizer");
      model_.push_back(p);
      if (IsLowPrecision(p.dtype())) {
        any_f16 = any_f16 || p.dtype() == kF16;
        Tensor master(p.data().to(kF32), /*requires_grad=*/true);
        master.set_name(p.name().empty() ? std::string("master") : p.name() + " (master)");
        p = master;  // the optimizer now updates the master
      }
      master_.push_back(p);
    }
  }
  master_grads_.resize(model_.size());
  core_ = std::make_unique<StepCore>(options, any_f16, device_);
}

MixedPrecisionOptimizer::~MixedPrecisionOptimizer() { detach(); }

Tensor MixedPrecisionOptimizer::scale(const Tensor& loss) const {
  TG_CHECK(loss.defined(), kName, ": scale() got an undefined loss");
  return core_->Scale(loss);
}

void MixedPrecisionOptimizer::backward(const Tensor& loss, const MasterBackwardOptions& options) {
  const Tensor scaled = scale(loss);
  // The hooks of attach() must not queue a second update for this backward.
  struct Quiet {
    bool& flag;
    bool previous;
    ~Quiet() { flag = previous; }
  } quiet{in_facade_backward_, in_facade_backward_};
  in_facade_backward_ = true;
  BackwardOptions backward_options;
  backward_options.retain_graph = options.retain_graph;
  scaled.backward(Tensor(), backward_options);
  if (options.update_master_grads) update_master_grads();
}

bool MixedPrecisionOptimizer::HasModelGrads() const {
  for (const Tensor& p : model_) {
    if (p.grad().defined()) return true;
  }
  return false;
}

void MixedPrecisionOptimizer::update_master_grads() {
  std::vector<size_t> index;
  std::vector<RawTensor> fresh;  // each param's new contribution, f32 (f64 for f64 params)
  for (size_t i = 0; i < model_.size(); ++i) {
    const Tensor g = model_[i].grad();
    if (!g.defined()) continue;
    // Always a copy: a .grad may be a broadcast view or shared between parameters (the engine
    // hands one gradient to several inputs), so it must not be unscaled in place.
    const DType to = model_[i].dtype() == kF64 ? kF64 : kF32;
    fresh.push_back(g.dtype() == to ? g.data().clone() : g.data().to(to));
    index.push_back(i);
    model_[i].set_grad(Tensor());  // the next backward accumulates only its own gradients
  }
  if (fresh.empty()) return;
  // One fused pass: divide by the scale and record inf/NaN (found_inf accumulates until step).
  core_->Unscale(fresh);
  for (size_t k = 0; k < index.size(); ++k) {
    RawTensor& master_grad = master_grads_[index[k]];
    master_grad = master_grad.defined() ? tg::Add(master_grad, fresh[k]) : std::move(fresh[k]);
  }
  ++master_grad_updates_;
  TraceEvent("amp", "master-gradient update (", index.size(), " parameters)");
}

void MixedPrecisionOptimizer::MakeMasterGradsCurrent() {
  if (HasModelGrads()) update_master_grads();
}

void MixedPrecisionOptimizer::unscale() {
  TG_CHECK(!unscaled_, kName, ": unscale() has already been called since the last step()");
  MakeMasterGradsCurrent();
  unscaled_ = true;
}

StepResult MixedPrecisionOptimizer::step() {
  MakeMasterGradsCurrent();
  std::vector<MasterPiece> pieces(master_.size());
  for (size_t i = 0; i < master_.size(); ++i) {
    pieces[i].master = master_[i];
    pieces[i].grad = master_grads_[i];
    if (!master_[i].is_same(model_[i])) pieces[i].model_copy = model_[i].data();
  }
  const StepResult result = core_->Step(
      pieces, *optimizer_, [this] { ClearAllGrads(); },
      [this] {
        for (size_t i = 0; i < master_.size(); ++i) {
          if (master_[i].is_same(model_[i]) || !master_grads_[i].defined()) continue;
          model_[i].bump_version();
        }
      });
  unscaled_ = false;
  return result;
}

std::optional<std::vector<RawTensor>> MixedPrecisionOptimizer::inspect_master_grads() const {
  if (HasModelGrads()) return std::nullopt;
  return master_grads_;
}

double MixedPrecisionOptimizer::clip_master_grads(double max_norm, double norm_type) {
  MakeMasterGradsCurrent();
  std::vector<RawTensor> grads;
  for (const RawTensor& g : master_grads_) {
    if (g.defined()) grads.push_back(g);
  }
  return core_->ClipGradNorm(grads, max_norm, norm_type);  // scales master_grads_ in place
}

void MixedPrecisionOptimizer::ClearAllGrads() {
  for (size_t i = 0; i < model_.size(); ++i) {
    model_[i].set_grad(Tensor());
    master_[i].set_grad(Tensor());
  }
  master_grads_.assign(master_grads_.size(), RawTensor());
  core_->ClearFoundInf();
}

void MixedPrecisionOptimizer::zero_grad() { ClearAllGrads(); }

StateDict MixedPrecisionOptimizer::state_dict() const {
  StateDict state;
  for (size_t i = 0; i < master_.size(); ++i) {
    if (!master_[i].is_same(model_[i])) {
      state.tensors["master." + std::to_string(i)] = master_[i].data().clone();
    }
  }
  state.Merge("optimizer.", optimizer_->state_dict());
  state.Merge("scaler.", core_->scaler().state_dict());
  return state;
}

void MixedPrecisionOptimizer::load_state_dict(const StateDict& state) {
  // Everything is validated before anything changes.
  std::vector<RawTensor> masters(master_.size());
  for (size_t i = 0; i < master_.size(); ++i) {
    const std::string key = "master." + std::to_string(i);
    if (master_[i].is_same(model_[i])) {
      TG_CHECK(!state.has_tensor(key), kName, ": load_state_dict: unexpected '", key,
               "' (parameter ", i, " is ", DTypeName(model_[i].dtype()),
               " and has no master copy)");
      continue;
    }
    TG_CHECK(state.has_tensor(key), kName, ": load_state_dict: missing '", key, "'");
    masters[i] = state.tensor(key);
    TG_CHECK(masters[i].dtype() == kF32 && masters[i].shape() == master_[i].shape(), kName,
             ": load_state_dict: '", key, "' is ", DTypeName(masters[i].dtype()), " ",
             ShapeToString(masters[i].shape()), " but the master is f32 ",
             ShapeToString(master_[i].shape()));
    // A NaN master would skip every step (its f16 copy overflows), an inf one trains on.
    TG_CHECK(!AnyNonFinite({masters[i]}), kName, ": load_state_dict: '", key,
             "' holds a NaN or infinite value; master weights must be finite");
  }
  for (const auto& [key, value] : state.tensors) {
    (void)value;
    TG_CHECK(key.rfind("master.", 0) == 0 || key.rfind("optimizer.", 0) == 0, kName,
             ": load_state_dict: unexpected tensor '", key, "'");
  }
  LossScaler scaler = core_->scaler();
  scaler.load_state_dict(state.Sub("scaler."));
  optimizer_->load_state_dict(state.Sub("optimizer."));  // validates, then changes
  core_->scaler() = scaler;
  NoGradGuard no_grad;
  for (size_t i = 0; i < master_.size(); ++i) {
    if (!masters[i].defined()) continue;
    master_[i].data().copy_(masters[i]);
    master_[i].bump_version();
    model_[i].data().copy_(masters[i]);
    model_[i].bump_version();
  }
  ClearAllGrads();
  unscaled_ = false;
}

void MixedPrecisionOptimizer::attach() {
  TG_CHECK(hooks_.empty(), kName, ": attach() was already called");
  for (const Tensor& p : model_) {
    if (!p.requires_grad()) continue;
    hooks_.push_back(p.register_post_accumulate_grad_hook([this](const Tensor&) {
      if (in_facade_backward_ || backward_issued_in_forward()) return;
      const int64_t task = outermost_graph_task_id();
      if (task == armed_task_) return;  // already queued for this backward
      armed_task_ = task;
      queue_callback_on_outermost_task([this] { update_master_grads(); },
                                       "amp master-gradient update");
    }));
  }
}

void MixedPrecisionOptimizer::detach() {
  for (HookHandle& h : hooks_) h.remove();
  hooks_.clear();
}

}  // namespace amp
}  // namespace tg
