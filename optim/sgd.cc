#include "optim/sgd.h"

#include <map>
#include <tuple>
#include <utility>

#include "tensor/composed.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace tg::optim {
namespace {

constexpr char kMomentumBuffer[] = "momentum_buffer";

}  // namespace

std::unique_ptr<OptimizerOptions> SGDOptions::clone() const {
  return std::make_unique<SGDOptions>(*this);
}

std::vector<NamedOption> SGDOptions::named() const {
  return {{"dampening", dampening_},
          {"lr", lr_},
          {"momentum", momentum_},
          {"nesterov", nesterov_ ? 1.0 : 0.0},
          {"weight_decay", weight_decay_}};
}

bool SGDOptions::SetNamed(const std::string& name, double value, const std::string& context) {
  if (name == "dampening") {
    dampening_ = value;
  } else if (name == "lr") {
    lr_ = value;
  } else if (name == "momentum") {
    momentum_ = value;
  } else if (name == "nesterov") {
    nesterov_ = NamedBool(name, value, context);
  } else if (name == "weight_decay") {
    weight_decay_ = value;
  } else {
    return false;
  }
  return true;
}

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : SGD(OneGroup("SGD", std::move(params)), options) {}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& defaults)
    : Optimizer("SGD", std::make_unique<SGDOptions>(defaults), defaults.fused()) {
  Init(std::move(groups));
}

bool SGD::AcceptsOptions(const OptimizerOptions& options) const {
  return dynamic_cast<const SGDOptions*>(&options) != nullptr;
}

void SGD::CheckOptions(const OptimizerOptions& options, const std::string& context) const {
  const SGDOptions& o = static_cast<const SGDOptions&>(options);
  TG_CHECK(o.lr() >= 0, context, "invalid lr ", o.lr(), " (must be >= 0)");
  TG_CHECK(o.momentum() >= 0, context, "invalid momentum ", o.momentum(), " (must be >= 0)");
  TG_CHECK(o.weight_decay() >= 0, context, "invalid weight_decay ", o.weight_decay(),
           " (must be >= 0)");
  TG_CHECK(!o.nesterov() || (o.momentum() > 0 && o.dampening() == 0), context,
           "nesterov momentum requires a momentum > 0 and zero dampening, got momentum ",
           o.momentum(), " and dampening ", o.dampening());
}

Optimizer::StateSpec SGD::ParamStateSpec(const OptimizerOptions& options) const {
  StateSpec spec;
  // A buffer made while momentum was on may outlive a change of momentum to 0.
  (static_cast<const SGDOptions&>(options).momentum() != 0 ? spec.tensors : spec.optional_tensors)
      .push_back(kMomentumBuffer);
  return spec;
}

void SGD::StepGroup(const ParamGroup& group, const std::vector<ParamUpdate>& updates) {
  const SGDOptions& o = group.options_as<SGDOptions>();
  // One call per device and buffer state (new buffers are set to the gradient): the op takes
  // the tensors of one device.
  using Key = std::tuple<DeviceType, int, bool>;  // (device, init)
  std::map<Key, SgdTensorLists> lists;
  for (const ParamUpdate& u : updates) {
    const RawTensor& param = u.param.data();
    RawTensor buf;
    bool init_buf = false;
    if (o.momentum() != 0) {
      auto it = u.state->tensors.find(kMomentumBuffer);
      if (it == u.state->tensors.end()) {
        buf = RawTensor::Empty(param.shape(), StateDType(param.dtype()), param.device());
        u.state->tensors[kMomentumBuffer] = buf;
        init_buf = true;
      } else {
        buf = it->second;
      }
    }
    const Key key(param.device().type, param.device().index, init_buf);
    SgdTensorLists& l = lists[key];
    l.params.push_back(param);
    l.grads.push_back(u.grad);
    if (buf.defined()) l.momentum_buffers.push_back(buf);
  }
  FusedSgdOptions f;
  f.lr = o.lr();
  f.weight_decay = o.weight_decay();
  f.momentum = o.momentum();
  f.dampening = o.dampening();
  f.nesterov = o.nesterov();
  for (const auto& [key, l] : lists) {
    f.init_momentum_buffers = std::get<2>(key);
    if (fused()) {
      FusedSgd(l, f);  // the device's one-pass kernel, or the composed ops where it declines
    } else {
      composed::FusedSgd(l, f);  // PyTorch's _single_tensor_sgd: several passes per parameter
    }
  }
}

}  // namespace tg::optim
