#include "optim/adam.h"

#include <cmath>
#include <map>
#include <utility>

#include "optim/foreach.h"
#include "tensor/convert.h"
#include "tensor/cuda/amp_kernels.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace tg::optim {
namespace {

constexpr char kStep[] = "step";
constexpr char kExpAvg[] = "exp_avg";
constexpr char kExpAvgSq[] = "exp_avg_sq";
constexpr char kMaxExpAvgSq[] = "max_exp_avg_sq";

enum class Decay { kNone, kL2, kDecoupled };

std::vector<ParamGroup> OneGroup(const char* name, std::vector<Variable> params) {
  TG_CHECK(!params.empty(), name, ": got an empty parameter list");
  return {ParamGroup(std::move(params))};
}

// Host scalars of one parameter's update, in double (Python floats in PyTorch).
struct AdamScalars {
  double decay;                  // 1 - lr * weight_decay (AdamW)
  double step_size;              // lr / (1 - beta1^t)
  double bias_correction2_sqrt;  // sqrt(1 - beta2^t)
};

AdamScalars HostScalars(const AdamOptions& o, double step) {
  AdamScalars s;
  s.decay = 1 - o.lr * o.weight_decay;
  const double bias_correction1 = 1 - std::pow(o.beta1, step);
  const double bias_correction2 = 1 - std::pow(o.beta2, step);
  s.step_size = o.lr / bias_correction1;
  s.bias_correction2_sqrt = std::sqrt(bias_correction2);
  return s;
}

// The state of a parameter, created at its first step (zeros, compute dtype).
struct AdamState {
  Tensor exp_avg, exp_avg_sq, max_exp_avg_sq;  // [param shape] StateDType(param); last: amsgrad
  double step;                                 // after this update's increment
};

AdamState PrepareState(StateDict* state, const Tensor& param, bool amsgrad) {
  const DType cd = StateDType(param.dtype());
  auto get = [&](const char* key) {
    auto it = state->tensors.find(key);
    if (it != state->tensors.end()) return it->second;
    Tensor t = Tensor::Zeros(param.shape(), cd, param.device());
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

// Compute-type scalars of the fused loop, each rounded once from its double.
template <typename C>
struct LoopScalars {
  C weight_decay, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size,
      bias_correction2_sqrt;
};

// The fused update of one contiguous tensor: the per-tensor path's operations, in its order,
// on one element at a time.
template <typename T, typename G, typename C, Decay kDecay, bool kAmsgrad>
void AdamLoop(T* p, const G* g, C* m, C* v, C* vmax, int64_t n, const LoopScalars<C>& s) {
  for (int64_t i = 0; i < n; ++i) {
    C pv = Convert<C>(p[i]);
    C gv = Convert<C>(g[i]);
    if constexpr (kDecay == Decay::kL2) gv = gv + pv * s.weight_decay;
    if constexpr (kDecay == Decay::kDecoupled) pv = pv * s.decay;
    const C mv = m[i] * s.beta1 + gv * s.one_minus_beta1;
    m[i] = mv;
    C vv = v[i] * s.beta2 + (gv * s.one_minus_beta2) * gv;
    v[i] = vv;
    if constexpr (kAmsgrad) {
      const C a = vmax[i];  // maximum(vmax, v) exactly as the Maximum kernel: NaN wins
      vv = std::isnan(a) ? a : std::isnan(vv) ? vv : (a > vv ? a : vv);
      vmax[i] = vv;
    }
    const C denom = std::sqrt(vv) / s.bias_correction2_sqrt + s.eps;
    p[i] = Convert<T>(pv - (mv * s.step_size) / denom);
  }
}

// Whether cuda::FusedAdamW does an update: an f32 parameter (its own master, or an f32 master
// whose f16/bf16/f32 model copy the kernel writes too), no L2 decay, contiguous tensors. Anything
// the kernel would reject takes the composed ops instead (FusedAdamW throws after the state's
// step counts have moved).
bool FusedAdamWApplies(const Tensor& param, const Tensor& grad, const Tensor& model_copy,
                       Decay decay) {
  const DType g = grad.dtype();
  return decay != Decay::kL2 && param.dtype() == kF32 && param.is_contiguous() &&
         (g == kF32 || g == kF16 || g == kBF16) &&
         (!model_copy.defined() || (model_copy.is_contiguous() && model_copy.dtype() != kF64));
}

}  // namespace

GroupOptions AdamOptions::ToGroupOptions() const {
  return {{"lr", lr},
          {"beta1", beta1},
          {"beta2", beta2},
          {"eps", eps},
          {"weight_decay", weight_decay},
          {"amsgrad", amsgrad ? 1.0 : 0.0}};
}

AdamOptions AdamOptions::FromGroup(const GroupOptions& options) {
  ParamGroup g({}, options);
  AdamOptions o;
  o.lr = g.option("lr");
  o.beta1 = g.option("beta1");
  o.beta2 = g.option("beta2");
  o.eps = g.option("eps");
  o.weight_decay = g.option("weight_decay");
  o.amsgrad = g.option("amsgrad") != 0;
  return o;
}

Adam::Adam(std::vector<Variable> params, const AdamOptions& options)
    : Adam("Adam", false, OneGroup("Adam", std::move(params)), options) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults)
    : Adam("Adam", false, std::move(groups), defaults) {}

Adam::Adam(const char* name, bool decoupled, std::vector<ParamGroup> groups,
           const AdamOptions& defaults)
    : Optimizer(name, defaults.ToGroupOptions(), defaults.fused), decoupled_(decoupled) {
  Init(std::move(groups));
}

AdamW::AdamW(std::vector<Variable> params, const AdamWOptions& options)
    : Adam("AdamW", true, OneGroup("AdamW", std::move(params)), options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults)
    : Adam("AdamW", true, std::move(groups), defaults) {}

void Adam::CheckOptions(const GroupOptions& options, const std::string& context) const {
  const AdamOptions o = AdamOptions::FromGroup(options);
  TG_CHECK(o.lr >= 0, context, "invalid lr ", o.lr, " (must be >= 0)");
  TG_CHECK(o.eps >= 0, context, "invalid eps ", o.eps, " (must be >= 0)");
  TG_CHECK(o.beta1 >= 0 && o.beta1 < 1, context, "invalid beta1 ", o.beta1, " (must be in [0, 1))");
  TG_CHECK(o.beta2 >= 0 && o.beta2 < 1, context, "invalid beta2 ", o.beta2, " (must be in [0, 1))");
  TG_CHECK(o.weight_decay >= 0, context, "invalid weight_decay ", o.weight_decay,
           " (must be >= 0)");
  const double amsgrad = options.at("amsgrad");
  TG_CHECK(amsgrad == 0 || amsgrad == 1, context, "amsgrad must be 0 or 1, got ", amsgrad);
}

Optimizer::StateSpec Adam::ParamStateSpec(const GroupOptions& options) const {
  StateSpec spec;
  spec.tensors = {kExpAvg, kExpAvgSq};
  (options.at("amsgrad") != 0 ? spec.tensors : spec.optional_tensors).push_back(kMaxExpAvgSq);
  spec.scalars = {kStep};
  return spec;
}

void Adam::StepGroup(const ParamGroup& group, const std::vector<ParamUpdate>& updates) {
  const AdamOptions o = AdamOptions::FromGroup(group.options);
  const Decay decay = o.weight_decay == 0 ? Decay::kNone
                      : decoupled_        ? Decay::kDecoupled
                                          : Decay::kL2;
  std::vector<const ParamUpdate*> on_device;  // for cuda::FusedAdamW, after this loop
  for (const ParamUpdate& u : updates) {
    const Tensor& param = u.param.data();
    const bool cuda = param.device().is_cuda();
    if (cuda && fused() && FusedAdamWApplies(param, u.grad, u.model_copy, decay)) {
      on_device.push_back(&u);
      continue;
    }
    const AdamState st = PrepareState(u.state, param, o.amsgrad);
    const AdamScalars hs = HostScalars(o, st.step);
    // The host loop below cannot touch device memory: the other CUDA cases (f64 or f16/bf16
    // params without masters, Adam's L2 decay) take the composed tensor ops, which run there.
    if (!fused() || cuda) {
      // PyTorch's _single_tensor_adam with composed tensor ops: several passes per parameter.
      const DType cd = StateDType(param.dtype());
      Tensor p = param.to(cd);  // [param shape] compute dtype
      Tensor g = u.grad.to(cd);
      if (decay == Decay::kL2) g = Add(g, MulScalar(p, o.weight_decay));
      if (decay == Decay::kDecoupled) p = MulScalar(p, hs.decay);
      st.exp_avg.copy_(Add(MulScalar(st.exp_avg, o.beta1), MulScalar(g, 1 - o.beta1)));
      st.exp_avg_sq.copy_(
          Add(MulScalar(st.exp_avg_sq, o.beta2), Mul(MulScalar(g, 1 - o.beta2), g)));
      Tensor v = st.exp_avg_sq;
      if (o.amsgrad) {
        st.max_exp_avg_sq.copy_(Maximum(st.max_exp_avg_sq, st.exp_avg_sq));
        v = st.max_exp_avg_sq;
      }
      const Tensor denom =
          AddScalar(BinaryScalar(BinaryOp::kDiv, Sqrt(v), hs.bias_correction2_sqrt), o.eps);
      param.copy_(Sub(p, Div(MulScalar(st.exp_avg, hs.step_size), denom)));
      continue;
    }
    // Fused: one pass over p, g, m, v (and vmax) per parameter.
    const internal::FlatParam f = internal::FlatParam::Make(param, u.grad);
    TG_CHECK(st.exp_avg.is_contiguous() && st.exp_avg_sq.is_contiguous() &&
                 (!o.amsgrad || st.max_exp_avg_sq.is_contiguous()),
             name(), ": state tensors must be contiguous");
    internal::VisitParamGrad(f.param.dtype(), f.grad.dtype(), [&](auto p_tag, auto g_tag) {
      using T = decltype(p_tag);
      using G = decltype(g_tag);
      using C = ComputeType<T>;
      LoopScalars<C> s;
      s.weight_decay = static_cast<C>(o.weight_decay);
      s.decay = static_cast<C>(hs.decay);
      s.beta1 = static_cast<C>(o.beta1);
      s.one_minus_beta1 = static_cast<C>(1 - o.beta1);
      s.beta2 = static_cast<C>(o.beta2);
      s.one_minus_beta2 = static_cast<C>(1 - o.beta2);
      s.eps = static_cast<C>(o.eps);
      s.step_size = static_cast<C>(hs.step_size);
      s.bias_correction2_sqrt = static_cast<C>(hs.bias_correction2_sqrt);
      T* p = f.param.data<T>();
      const G* g = f.grad.data<G>();
      C* m = st.exp_avg.data<C>();
      C* v = st.exp_avg_sq.data<C>();
      C* vmax = o.amsgrad ? st.max_exp_avg_sq.data<C>() : nullptr;
      const int64_t n = f.param.numel();
      internal::WithFlag(o.amsgrad, [&](auto ams) {
        constexpr bool kAms = decltype(ams)::value;
        switch (decay) {
          case Decay::kNone:
            return AdamLoop<T, G, C, Decay::kNone, kAms>(p, g, m, v, vmax, n, s);
          case Decay::kL2:
            return AdamLoop<T, G, C, Decay::kL2, kAms>(p, g, m, v, vmax, n, s);
          case Decay::kDecoupled:
            return AdamLoop<T, G, C, Decay::kDecoupled, kAms>(p, g, m, v, vmax, n, s);
        }
      });
    });
    f.WriteBack(param);
  }
  if (!on_device.empty()) StepFusedCuda(o, on_device);
}

void Adam::StepFusedCuda(const AdamOptions& o, const std::vector<const ParamUpdate*>& updates) {
  // One launch per device and distinct step count (all parameters share the count unless some
  // were added later or skipped steps without a gradient), over every parameter of the group:
  // cuda::FusedAdamW takes the tensors of one device and one step number.
  using Key = std::pair<int, double>;  // (CUDA device index, step)
  std::map<Key, cuda::AdamWTensorLists> by_step;
  std::map<Key, bool> has_copies;
  for (const ParamUpdate* u : updates) {
    const Tensor& param = u->param.data();
    const AdamState st = PrepareState(u->state, param, o.amsgrad);
    const Key key(param.device().index, st.step);
    cuda::AdamWTensorLists& lists = by_step[key];
    lists.grads.push_back(u->grad.contiguous());
    lists.masters.push_back(param);
    lists.exp_avgs.push_back(st.exp_avg);
    lists.exp_avg_sqs.push_back(st.exp_avg_sq);
    if (o.amsgrad) lists.max_exp_avg_sqs.push_back(st.max_exp_avg_sq);
    lists.model_params.push_back(u->model_copy);  // undefined: no low-precision copy
    if (u->model_copy.defined()) {
      has_copies[key] = true;
      u->model_copy_written = true;  // written by the same pass
    }
  }
  for (auto& [key, lists] : by_step) {
    if (!has_copies[key]) lists.model_params.clear();
    cuda::FusedAdamWOptions f;
    f.lr = o.lr;
    f.beta1 = o.beta1;
    f.beta2 = o.beta2;
    f.eps = o.eps;
    // Adam without weight decay is AdamW with decay 0 (a factor of exactly 1, see amp_kernels.h).
    f.weight_decay = o.weight_decay;
    f.amsgrad = o.amsgrad;
    f.step = static_cast<int64_t>(key.second);
    cuda::FusedAdamW(lists, f);
  }
}

}  // namespace tg::optim
