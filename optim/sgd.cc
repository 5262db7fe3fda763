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

std::vector<ParamGroup> OneGroup(const char* name, std::vector<Tensor> params) {
  TG_CHECK(!params.empty(), name, ": got an empty parameter list");
  return {ParamGroup(std::move(params))};
}

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
  const RawTensor found_inf = updates.empty() ? RawTensor() : updates[0].found_inf;
  // step(found_inf): a buffer made while a skip is decided on the device gets a flag there
  // (FusedSgdOptions::momentum_buffers_valid: 0 until an update that was not skipped sets it),
  // one per device for the buffers made in this call, so whether the buffer is initialised
  // needs no host decision.
  if (found_inf.defined() && o.momentum() != 0) {
    std::map<std::pair<DeviceType, int>, RawTensor> made;
    for (const ParamUpdate& u : updates) {
      if (u.state->tensors.count(kMomentumBuffer) != 0) continue;
      const RawTensor& param = u.param.data();
      u.state->tensors[kMomentumBuffer] =
          RawTensor::Zeros(param.shape(), StateDType(param.dtype()), param.device());
      RawTensor& flag = made[{param.device().type, param.device().index}];
      if (!flag.defined()) flag = RawTensor::Zeros({}, kF32, param.device());
      (*u.device_state)[kMomentumBuffer] = flag;
    }
    UnshareDeviceState(updates, kMomentumBuffer);
  }
  // One call per device and buffer state (new buffers are set to the gradient; flagged ones as
  // their flag says): the op takes the tensors of one device.
  using Key = std::tuple<DeviceType, int, bool, const void*>;  // (device, init, flag)
  std::map<Key, SgdTensorLists> lists;
  std::map<Key, RawTensor> flags;
  for (const ParamUpdate& u : updates) {
    const RawTensor& param = u.param.data();
    RawTensor buf, flag;
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
      if (u.device_state != nullptr) {
        auto f = u.device_state->find(kMomentumBuffer);
        if (f != u.device_state->end()) flag = f->second;
      }
    }
    const Key key(param.device().type, param.device().index, init_buf,
                  flag.defined() ? flag.raw_data() : nullptr);
    if (flag.defined()) flags[key] = flag;
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
  f.found_inf = found_inf;
  for (const auto& [key, l] : lists) {
    f.init_momentum_buffers = std::get<2>(key);
    auto flag = flags.find(key);
    f.momentum_buffers_valid = flag != flags.end() ? flag->second : RawTensor();
    if (fused()) {
      FusedSgd(l, f);  // the device's one-pass kernel, or the composed ops where it declines
    } else {
      composed::FusedSgd(l, f);  // PyTorch's _single_tensor_sgd: several passes per parameter
    }
  }
}

bool SGD::DeviceStateToHost(std::map<std::string, RawTensor>* device_state,
                            StateDict* state) const {
  auto it = device_state->find(kMomentumBuffer);
  if (it == device_state->end()) return true;
  const bool valid = it->second.item() != 0;  // the one host read (a device sync on a GPU)
  device_state->erase(it);
  if (valid) return true;
  // Made by steps that were all skipped: no buffer (and no state unless it holds more), as the
  // host-decided path would have.
  state->tensors.erase(kMomentumBuffer);
  return !state->tensors.empty() || !state->scalars.empty();
}

}  // namespace tg::optim
