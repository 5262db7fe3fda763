#include "optim/sgd.h"

#include <utility>

#include "optim/foreach.h"
#include "tensor/convert.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace tg::optim {
namespace {

constexpr char kMomentumBuffer[] = "momentum_buffer";

std::vector<ParamGroup> OneGroup(const char* name, std::vector<Variable> params) {
  TG_CHECK(!params.empty(), name, ": got an empty parameter list");
  return {ParamGroup(std::move(params))};
}

// The fused update of one contiguous tensor: every operation of the per-tensor path, in its
// order, on one element at a time (C is the compute type; scalars are already rounded to it).
template <typename T, typename G, typename C, bool kWeightDecay, bool kMomentum, bool kInitBuf,
          bool kNesterov>
void SgdLoop(T* p, const G* g, C* buf, int64_t n, C lr, C weight_decay, C momentum,
             C one_minus_dampening) {
  for (int64_t i = 0; i < n; ++i) {
    const C pv = Convert<C>(p[i]);
    C gv = Convert<C>(g[i]);
    if constexpr (kWeightDecay) gv = gv + pv * weight_decay;
    if constexpr (kMomentum) {
      C b;
      if constexpr (kInitBuf) {
        b = gv;
      } else {
        b = buf[i] * momentum + gv * one_minus_dampening;
      }
      buf[i] = b;
      if constexpr (kNesterov) {
        gv = gv + b * momentum;
      } else {
        gv = b;
      }
    }
    p[i] = Convert<T>(pv - gv * lr);
  }
}

}  // namespace

GroupOptions SGDOptions::ToGroupOptions() const {
  return {{"lr", lr},
          {"momentum", momentum},
          {"dampening", dampening},
          {"weight_decay", weight_decay},
          {"nesterov", nesterov ? 1.0 : 0.0}};
}

SGDOptions SGDOptions::FromGroup(const GroupOptions& options) {
  ParamGroup g({}, options);
  SGDOptions o;
  o.lr = g.option("lr");
  o.momentum = g.option("momentum");
  o.dampening = g.option("dampening");
  o.weight_decay = g.option("weight_decay");
  o.nesterov = g.option("nesterov") != 0;
  return o;
}

SGD::SGD(std::vector<Variable> params, const SGDOptions& options)
    : SGD(OneGroup("SGD", std::move(params)), options) {}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& defaults)
    : Optimizer("SGD", defaults.ToGroupOptions(), defaults.fused) {
  Init(std::move(groups));
}

void SGD::CheckOptions(const GroupOptions& options, const std::string& context) const {
  const SGDOptions o = SGDOptions::FromGroup(options);
  TG_CHECK(o.lr >= 0, context, "invalid lr ", o.lr, " (must be >= 0)");
  TG_CHECK(o.momentum >= 0, context, "invalid momentum ", o.momentum, " (must be >= 0)");
  TG_CHECK(o.weight_decay >= 0, context, "invalid weight_decay ", o.weight_decay,
           " (must be >= 0)");
  const double nesterov = options.at("nesterov");
  TG_CHECK(nesterov == 0 || nesterov == 1, context, "nesterov must be 0 or 1, got ", nesterov);
  TG_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), context,
           "nesterov momentum requires a momentum > 0 and zero dampening, got momentum ",
           o.momentum, " and dampening ", o.dampening);
}

Optimizer::StateSpec SGD::ParamStateSpec(const GroupOptions& options) const {
  StateSpec spec;
  // A buffer made while momentum was on may outlive a change of momentum to 0.
  (options.at("momentum") != 0 ? spec.tensors : spec.optional_tensors).push_back(kMomentumBuffer);
  return spec;
}

void SGD::StepGroup(const ParamGroup& group, const std::vector<ParamUpdate>& updates) {
  const SGDOptions o = SGDOptions::FromGroup(group.options);
  if (!fused()) {
    StepPerTensor(o, updates);
    return;
  }
  // The fused loop runs on the host; CUDA parameters take the composed ops, which run there.
  std::vector<ParamUpdate> host, device;
  for (const ParamUpdate& u : updates) {
    (u.param.data().device().is_cpu() ? host : device).push_back(u);
  }
  if (device.empty()) {
    StepFused(o, updates);
    return;
  }
  if (!host.empty()) StepFused(o, host);
  StepPerTensor(o, device);
}

// PyTorch's _single_tensor_sgd with composed tensor ops: several passes over memory per param.
void SGD::StepPerTensor(const SGDOptions& o, const std::vector<ParamUpdate>& updates) {
  for (const ParamUpdate& u : updates) {
    const Tensor& param = u.param.data();
    const DType cd = StateDType(param.dtype());
    const Tensor p = param.to(cd);  // [param shape] compute dtype (param itself when f32/f64)
    Tensor g = u.grad.to(cd);
    if (o.weight_decay != 0) g = Add(g, MulScalar(p, o.weight_decay));
    if (o.momentum != 0) {
      auto it = u.state->tensors.find(kMomentumBuffer);
      Tensor buf;
      if (it == u.state->tensors.end()) {
        buf = g.clone();  // not g itself: g may be the caller's gradient
        u.state->tensors[kMomentumBuffer] = buf;
      } else {
        buf = it->second;
        buf.copy_(Add(MulScalar(buf, o.momentum), MulScalar(g, 1 - o.dampening)));
      }
      g = o.nesterov ? Add(g, MulScalar(buf, o.momentum)) : buf;
    }
    param.copy_(Sub(p, MulScalar(g, o.lr)));
  }
}

// One pass over memory per parameter: read p, g (and buf), write p (and buf).
void SGD::StepFused(const SGDOptions& o, const std::vector<ParamUpdate>& updates) {
  for (const ParamUpdate& u : updates) {
    const internal::FlatParam f = internal::FlatParam::Make(u.param.data(), u.grad);
    const DType cd = StateDType(f.param.dtype());
    Tensor buf;
    bool init_buf = false;
    if (o.momentum != 0) {
      auto it = u.state->tensors.find(kMomentumBuffer);
      if (it == u.state->tensors.end()) {
        buf = Tensor::Empty(f.param.shape(), cd, f.param.device());
        u.state->tensors[kMomentumBuffer] = buf;
        init_buf = true;
      } else {
        buf = it->second;
        TG_CHECK(buf.is_contiguous(), "SGD: momentum buffer is not contiguous");
      }
    }
    internal::VisitParamGrad(f.param.dtype(), f.grad.dtype(), [&](auto p_tag, auto g_tag) {
      using T = decltype(p_tag);
      using G = decltype(g_tag);
      using C = ComputeType<T>;
      T* p = f.param.data<T>();
      const G* g = f.grad.data<G>();
      C* b = buf.defined() ? buf.data<C>() : nullptr;
      const int64_t n = f.param.numel();
      const C lr = static_cast<C>(o.lr);
      const C wd = static_cast<C>(o.weight_decay);
      const C mom = static_cast<C>(o.momentum);
      const C omd = static_cast<C>(1 - o.dampening);
      internal::WithFlag(o.weight_decay != 0, [&](auto wd_on) {
        constexpr bool kWd = decltype(wd_on)::value;
        if (o.momentum == 0) {
          SgdLoop<T, G, C, kWd, false, false, false>(p, g, b, n, lr, wd, mom, omd);
          return;
        }
        internal::WithFlag(init_buf, [&](auto init) {
          internal::WithFlag(o.nesterov, [&](auto nesterov) {
            SgdLoop<T, G, C, kWd, true, decltype(init)::value, decltype(nesterov)::value>(
                p, g, b, n, lr, wd, mom, omd);
          });
        });
      });
    });
    f.WriteBack(u.param.data());
  }
}

}  // namespace tg::optim
