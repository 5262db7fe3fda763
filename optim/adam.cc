#include "optim/adam.h"

#include <map>
#include <tuple>
#include <utility>

#include "tensor/composed.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace tg::optim {
namespace {

constexpr char kStep[] = "step";
constexpr char kExpAvg[] = "exp_avg";
constexpr char kExpAvgSq[] = "exp_avg_sq";
constexpr char kMaxExpAvgSq[] = "max_exp_avg_sq";

// The state of a parameter, created at its first step (zeros, compute dtype).
struct AdamState {
  RawTensor exp_avg, exp_avg_sq, max_exp_avg_sq;  // [param shape] StateDType(param); last: amsgrad
  double step;                                 // after this update's increment
};

AdamState PrepareState(StateDict* state, const RawTensor& param, bool amsgrad) {
  const DType cd = StateDType(param.dtype());
  auto get = [&](const char* key) {
    auto it = state->tensors.find(key);
    if (it != state->tensors.end()) return it->second;
    RawTensor t = RawTensor::Zeros(param.shape(), cd, param.device());
    state->tensors[key] = t;
    return t;
  };
  AdamState s;
  s.exp_avg = get(kExpAvg);
  s.exp_avg_sq = get(kExpAvgSq);
  if (amsgrad) s.max_exp_avg_sq = get(kMaxExpAvgSq);
  s.step = (state->has_scalar(kStep) ? state->scalar(kStep) : 0) + 1;
  state->scalars[kStep] = s.step;
  return s;
}

}  // namespace

std::unique_ptr<OptimizerOptions> AdamOptions::clone() const {
  return std::make_unique<AdamOptions>(*this);
}

std::unique_ptr<OptimizerOptions> AdamWOptions::clone() const {
  return std::make_unique<AdamWOptions>(*this);
}

std::vector<NamedOption> AdamOptions::named() const {
  return {{"amsgrad", amsgrad_ ? 1.0 : 0.0},
          {"beta1", beta1_},
          {"beta2", beta2_},
          {"eps", eps_},
          {"lr", lr_},
          {"weight_decay", weight_decay_}};
}

bool AdamOptions::SetNamed(const std::string& name, double value, const std::string& context) {
  if (name == "amsgrad") {
    amsgrad_ = NamedBool(name, value, context);
  } else if (name == "beta1") {
    beta1_ = value;
  } else if (name == "beta2") {
    beta2_ = value;
  } else if (name == "eps") {
    eps_ = value;
  } else if (name == "lr") {
    lr_ = value;
  } else if (name == "weight_decay") {
    weight_decay_ = value;
  } else {
    return false;
  }
  return true;
}

Adam::Adam(std::vector<Tensor> params, const AdamOptions& options)
    : Adam("Adam", false, OneGroup("Adam", std::move(params)), options) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults)
    : Adam("Adam", false, std::move(groups), defaults) {}

Adam::Adam(const char* name, bool decoupled, std::vector<ParamGroup> groups,
           const AdamOptions& defaults)
    : Optimizer(name,
                decoupled ? std::unique_ptr<OptimizerOptions>(new AdamWOptions(defaults))
                          : std::make_unique<AdamOptions>(defaults),
                defaults.fused()),
      decoupled_(decoupled) {
  Init(std::move(groups));
}

Adam::Adam(const char* name, bool decoupled, std::unique_ptr<OptimizerOptions> defaults, bool fused)
    : Optimizer(name, std::move(defaults), fused), decoupled_(decoupled) {}

AdamW::AdamW(const char* name, std::unique_ptr<OptimizerOptions> defaults, bool fused)
    : Adam(name, /*decoupled=*/true, std::move(defaults), fused) {}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Adam("AdamW", true, OneGroup("AdamW", std::move(params)), options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults)
    : Adam("AdamW", true, std::move(groups), defaults) {}

bool Adam::AcceptsOptions(const OptimizerOptions& options) const {
  return dynamic_cast<const AdamOptions*>(&options) != nullptr;
}

void Adam::CheckOptions(const OptimizerOptions& options, const std::string& context) const {
  const AdamOptions& o = static_cast<const AdamOptions&>(options);
  TG_CHECK(o.lr() >= 0, context, "invalid lr ", o.lr(), " (must be >= 0)");
  // eps = 0 divides 0 by 0 for an element whose gradients were all 0 (NaN into the weights).
  TG_CHECK(o.eps() > 0, context, "invalid eps ", o.eps(), " (must be > 0)");
  TG_CHECK(o.beta1() >= 0 && o.beta1() < 1, context, "invalid beta1 ", o.beta1(),
           " (must be in [0, 1))");
  TG_CHECK(o.beta2() >= 0 && o.beta2() < 1, context, "invalid beta2 ", o.beta2(),
           " (must be in [0, 1))");
  TG_CHECK(o.weight_decay() >= 0, context, "invalid weight_decay ", o.weight_decay(),
           " (must be >= 0)");
}

Optimizer::StateSpec Adam::ParamStateSpec(const OptimizerOptions& options) const {
  StateSpec spec;
  spec.tensors = {kExpAvg, kExpAvgSq};
  (static_cast<const AdamOptions&>(options).amsgrad() ? spec.tensors : spec.optional_tensors)
      .push_back(kMaxExpAvgSq);
  spec.scalars = {kStep};
  return spec;
}

void Adam::StepGroup(const ParamGroup& group, const std::vector<ParamUpdate>& updates) {
  const AdamOptions& o = group.options_as<AdamOptions>();
  FusedAdamOptions f;
  f.lr = o.lr();
  f.beta1 = o.beta1();
  f.beta2 = o.beta2();
  f.eps = o.eps();
  f.weight_decay = o.weight_decay();
  f.decay = o.weight_decay() == 0 ? WeightDecay::kNone
            : decoupled_          ? WeightDecay::kDecoupled
                                  : WeightDecay::kL2;
  f.amsgrad = o.amsgrad();
  // One call per device and distinct step count (all parameters share the count unless some
  // were added later or skipped steps without a gradient): the op takes the tensors of one
  // device and one step number.
  using Key = std::tuple<DeviceType, int, double>;  // (device, step)
  std::map<Key, AdamTensorLists> by_step;
  std::map<Key, bool> has_copies;
  for (const ParamUpdate& u : updates) {
    const RawTensor& param = u.param.data();
    const AdamState st = PrepareState(u.state, param, o.amsgrad());
    const Key key(param.device().type, param.device().index, st.step);
    AdamTensorLists& lists = by_step[key];
    lists.params.push_back(param);
    lists.grads.push_back(u.grad);
    lists.exp_avgs.push_back(st.exp_avg);
    lists.exp_avg_sqs.push_back(st.exp_avg_sq);
    if (o.amsgrad()) lists.max_exp_avg_sqs.push_back(st.max_exp_avg_sq);
    lists.model_params.push_back(u.model_copy);  // undefined: no low-precision copy
    if (u.model_copy.defined()) {
      has_copies[key] = true;
      u.model_copy_written = true;  // written by the same call
    }
  }
  for (auto& [key, lists] : by_step) {
    if (!has_copies[key]) lists.model_params.clear();
    f.step = static_cast<int64_t>(std::get<2>(key));
    if (fused()) {
      FusedAdam(lists, f);  // the device's one-pass kernel, or the composed ops where it declines
    } else {
      composed::FusedAdam(lists, f);  // PyTorch's _single_tensor_adam: several passes per param
    }
  }
}

}  // namespace tg::optim
