// The optimizer entries of the kernel list (tensor/kernel_list.inc: FusedAdam, FusedSgd,
// GlobalGradNorm, ClipByNorm) on the CPU: one pass over each parameter's memory, the update's
// operations in the kernel list's order on one element at a time. Every case is handled (kDone).
// Built with -ffp-contract=off (BUILD): no a*b+c may become an FMA unless written as std::fma, so
// the loops round exactly like the composed forms.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tensor/convert.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/parallel.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/error.h"
#include "tensor/half.h"
#include "tensor/optimizer_kernels.h"

namespace tg::cpu {
namespace {

// Elements per thread below which an update loop stays on one thread (about 50 us of work).
constexpr int64_t kElementsPerThread = int64_t{1} << 15;

// A parameter and its gradient as contiguous tensors. The gradient has the parameter's dtype or
// the compute dtype; any other gradient dtype is converted to the compute dtype first (exactly
// what the composed form's grad.to(compute dtype) does). With inv_scale (0-d f32, defined), the
// gradient is a compute-dtype copy multiplied by it (ScaleInPlace: one rounding per element).
struct FlatParam {
  RawTensor param;  // contiguous; the parameter itself unless it was a strided view
  RawTensor grad;   // contiguous, dtype param.dtype() or the compute dtype
  bool copy_back;  // param is a copy that must be written back

  static FlatParam Make(const RawTensor& param, const RawTensor& grad, const RawTensor& inv_scale) {
    FlatParam f;
    f.copy_back = !param.is_contiguous();
    f.param = f.copy_back ? param.contiguous() : param;
    const DType cd = param.dtype() == kF64 ? kF64 : kF32;
    if (inv_scale.defined()) {
      f.grad = grad.to(cd).clone();  // a copy of its own: scaled in place below
      ScaleInPlace(f.grad, inv_scale.item(), false);
      return f;
    }
    f.grad = (grad.dtype() == param.dtype() || grad.dtype() == cd) ? grad : grad.to(cd);
    f.grad = f.grad.contiguous();
    return f;
  }
  void WriteBack(const RawTensor& param) const {
    if (copy_back) param.copy_(this->param);
  }
};

// Calls fn(T{}, G{}) with the storage types of the parameter (T) and the gradient (G), where G
// is T or the compute type (float for f16/bf16, T otherwise).
template <typename Fn>
void VisitParamGrad(const char* op, DType param, DType grad, Fn&& fn) {
  switch (param) {
    case DType::kF32:
      return fn(float{}, float{});
    case DType::kF64:
      return fn(double{}, double{});
    case DType::kF16:
      if (grad == kF16) return fn(Half{}, Half{});
      return fn(Half{}, float{});
    case DType::kBF16:
      if (grad == kBF16) return fn(BFloat16{}, BFloat16{});
      return fn(BFloat16{}, float{});
    default:
      throw Error(absl::StrCat(op, ": unsupported param dtype ", DTypeName(param)));
  }
}

// fn(std::integral_constant<bool, b>{}): turns a runtime flag into a template argument.
template <typename Fn>
void WithFlag(bool b, Fn&& fn) {
  if (b) {
    fn(std::true_type{});
  } else {
    fn(std::false_type{});
  }
}

// ---- Adam ----

// Compute-type scalars of the Adam loop, each rounded once from its double. The first moment's
// lerp towards g with weight w = 1 - beta1 is m = fma(lerp_weight, g - m, lerp_from_end ? g : m)
// with lerp_weight = w, or -(1 - w) from the end when |w| >= 0.5 (exact there).
template <typename C>
struct AdamScalars {
  C weight_decay, decay, lerp_weight, beta2, one_minus_beta2, eps, step_size, bias_correction2_sqrt;
  bool lerp_from_end;
};

template <typename T, typename G, typename C, WeightDecay kDecay, bool kAmsgrad>
void AdamLoop(T* p, const G* g, C* m, C* v, C* vmax, int64_t n, const AdamScalars<C>& s) {
  ParallelFor(n, kElementsPerThread, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<T, float> && std::is_same_v<G, float> && !kAmsgrad) {
      // All f32: the same operations on whole vectors (vec_math.h, chosen for this CPU).
      const AdamF32Scalars vs{static_cast<int>(kDecay == WeightDecay::kL2          ? 1
                                               : kDecay == WeightDecay::kDecoupled ? 2
                                                                                   : 0),
                              s.weight_decay,
                              s.decay,
                              s.lerp_weight,
                              s.beta2,
                              s.one_minus_beta2,
                              s.eps,
                              s.step_size,
                              s.bias_correction2_sqrt,
                              s.lerp_from_end};
      AdamF32(p + begin, g + begin, m + begin, v + begin, end - begin, vs);
      return;
    }
    for (int64_t i = begin; i < end; ++i) {
      C pv = Convert<C>(p[i]);
      C gv = Convert<C>(g[i]);
      if constexpr (kDecay == WeightDecay::kL2) gv = std::fma(s.weight_decay, pv, gv);
      if constexpr (kDecay == WeightDecay::kDecoupled) pv = pv * s.decay;
      const C mv = std::fma(s.lerp_weight, gv - m[i], s.lerp_from_end ? gv : m[i]);
      m[i] = mv;
      C vv = std::fma(gv * s.one_minus_beta2, gv, v[i] * s.beta2);
      v[i] = vv;
      if constexpr (kAmsgrad) {
        const C a = vmax[i];  // maximum(vmax, v) exactly as the Maximum kernel: NaN wins
        vv = std::isnan(a) ? a : std::isnan(vv) ? vv : (a > vv ? a : vv);
        vmax[i] = vv;
      }
      const C denom = std::sqrt(vv) / s.bias_correction2_sqrt + s.eps;
      p[i] = Convert<T>(pv - (mv * s.step_size) / denom);
    }
  });
}

// ---- SGD ----

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

void CheckContiguousState(const char* op, const RawTensor& t) {
  TG_CHECK(!t.defined() || t.is_contiguous(), op, ": state tensors must be contiguous");
}

}  // namespace

KernelStatus FusedAdam(const AdamTensorLists& lists, const FusedAdamOptions& o) {
  const char* op = "FusedAdam";
  if (o.found_inf.defined() && o.found_inf.item() != 0) return KernelStatus::kDone;
  const double step =
      o.device_step.defined() ? o.device_step.item() + 1 : static_cast<double>(o.step);
  const AdamStepScalars scalars = o.ScalarsAt(step);
  for (size_t i = 0; i < lists.params.size(); ++i) {
    const RawTensor& param = lists.params[i];
    if (param.numel() == 0) continue;
    const RawTensor& exp_avg = lists.exp_avgs[i];
    const RawTensor& exp_avg_sq = lists.exp_avg_sqs[i];
    const RawTensor max_exp_avg_sq = o.amsgrad ? lists.max_exp_avg_sqs[i] : RawTensor();
    CheckContiguousState(op, exp_avg);
    CheckContiguousState(op, exp_avg_sq);
    CheckContiguousState(op, max_exp_avg_sq);
    const FlatParam f = FlatParam::Make(param, lists.grads[i], o.inv_scale);
    VisitParamGrad(op, f.param.dtype(), f.grad.dtype(), [&](auto p_tag, auto g_tag) {
      using T = decltype(p_tag);
      using G = decltype(g_tag);
      using C = ComputeType<T>;
      AdamScalars<C> s;
      s.weight_decay = static_cast<C>(o.weight_decay);
      s.decay = static_cast<C>(scalars.decay);
      const C w = static_cast<C>(1 - o.beta1);
      s.lerp_from_end = !(std::abs(w) < C(0.5));
      s.lerp_weight = s.lerp_from_end ? -(C(1) - w) : w;
      s.beta2 = static_cast<C>(o.beta2);
      s.one_minus_beta2 = static_cast<C>(1 - o.beta2);
      s.eps = static_cast<C>(o.eps);
      s.step_size = static_cast<C>(scalars.step_size);
      s.bias_correction2_sqrt = static_cast<C>(scalars.bias_correction2_sqrt);
      T* p = f.param.data<T>();
      const G* g = f.grad.data<G>();
      C* m = exp_avg.data<C>();
      C* v = exp_avg_sq.data<C>();
      C* vmax = o.amsgrad ? max_exp_avg_sq.data<C>() : nullptr;
      const int64_t n = f.param.numel();
      WithFlag(o.amsgrad, [&](auto ams) {
        constexpr bool kAms = decltype(ams)::value;
        switch (o.decay) {
          case WeightDecay::kNone:
            return AdamLoop<T, G, C, WeightDecay::kNone, kAms>(p, g, m, v, vmax, n, s);
          case WeightDecay::kL2:
            return AdamLoop<T, G, C, WeightDecay::kL2, kAms>(p, g, m, v, vmax, n, s);
          case WeightDecay::kDecoupled:
            return AdamLoop<T, G, C, WeightDecay::kDecoupled, kAms>(p, g, m, v, vmax, n, s);
        }
      });
    });
    f.WriteBack(param);
    if (!lists.model_params.empty() && lists.model_params[i].defined()) {
      lists.model_params[i].copy_(param);  // rounded to the model's dtype
    }
  }
  if (o.device_step.defined()) o.device_step.fill_(step);
  return KernelStatus::kDone;
}

KernelStatus FusedSgd(const SgdTensorLists& lists, const FusedSgdOptions& o) {
  const char* op = "FusedSgd";
  // The CPU reads its flags where they live (its memory): no wait.
  if (o.found_inf.defined() && o.found_inf.item() != 0) return KernelStatus::kDone;
  const bool init_buffers = o.momentum_buffers_valid.defined()
                                ? o.momentum_buffers_valid.item() == 0
                                : o.init_momentum_buffers;
  for (size_t i = 0; i < lists.params.size(); ++i) {
    const RawTensor& param = lists.params[i];
    if (param.numel() == 0) continue;
    const FlatParam f = FlatParam::Make(param, lists.grads[i], RawTensor());
    const RawTensor buf = o.momentum != 0 ? lists.momentum_buffers[i] : RawTensor();
    CheckContiguousState(op, buf);
    VisitParamGrad(op, f.param.dtype(), f.grad.dtype(), [&](auto p_tag, auto g_tag) {
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
      WithFlag(o.weight_decay != 0, [&](auto wd_on) {
        constexpr bool kWd = decltype(wd_on)::value;
        if (o.momentum == 0) {
          SgdLoop<T, G, C, kWd, false, false, false>(p, g, b, n, lr, wd, mom, omd);
          return;
        }
        WithFlag(init_buffers, [&](auto init) {
          WithFlag(o.nesterov, [&](auto nesterov) {
            SgdLoop<T, G, C, kWd, true, decltype(init)::value, decltype(nesterov)::value>(
                p, g, b, n, lr, wd, mom, omd);
          });
        });
      });
    });
    f.WriteBack(param);
  }
  if (o.momentum_buffers_valid.defined()) o.momentum_buffers_valid.fill_(1);
  return KernelStatus::kDone;
}

namespace {

// One partial of the global norm: the sum of |x|^p over a chunk, or its max |x| (inf norm) with
// whether it held a NaN.
struct NormPartial {
  double value = 0;
  bool nan = false;
};

// The partial of x[0, n): eight interleaved f64 accumulators (the loop vectorises; a single
// running sum waits on every add), combined in a fixed order.
template <typename T, typename Term>
NormPartial SumChunk(const T* x, int64_t n, Term term) {
  double acc[8] = {};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += term(Convert<double>(x[k + l]));
  }
  for (int l = 0; k < n; ++k, ++l) acc[l] += term(Convert<double>(x[k]));
  return {((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])), false};
}

template <typename T>
NormPartial MaxChunk(const T* x, int64_t n) {
  NormPartial r;
  for (int64_t k = 0; k < n; ++k) {
    const double a = std::fabs(Convert<double>(x[k]));
    r.nan |= a != a;
    r.value = a > r.value ? a : r.value;
  }
  return r;
}

}  // namespace

// Each tensor in chunks of kNormChunk elements, the chunks' partials on all threads and then
// combined in list and chunk order: the same result at any thread count.
KernelStatus GlobalGradNorm(const RawTensor& norm, const std::vector<RawTensor>& tensors,
                            double norm_type) {
  constexpr int64_t kNormChunk = int64_t{1} << 14;
  const bool inf_norm = std::isinf(norm_type);
  double acc = 0;  // sum of |x|^p, or max |x| for the inf norm
  bool nan = false;
  for (const RawTensor& t : tensors) {
    const RawTensor c = t.contiguous();
    VisitFloating("GlobalGradNorm", c.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* x = c.data<T>();
      const int64_t n = c.numel();
      const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
      std::vector<NormPartial> partials(static_cast<size_t>(chunks));
      ParallelFor(chunks, 2, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const T* p = x + i * kNormChunk;
          const int64_t len = std::min(kNormChunk, n - i * kNormChunk);
          NormPartial& r = partials[static_cast<size_t>(i)];
          if (inf_norm) {
            r = MaxChunk(p, len);
          } else if (norm_type == 2) {
            if constexpr (std::is_same_v<T, float>) {
              // Vectorized, in SumChunk's order and with its bits: (double(x) - 0)^2 = x^2.
              r = {SumSquaredDeviationsF64(p, len, 0.0), false};
            } else {
              r = SumChunk(p, len, [](double v) { return v * v; });
            }
          } else if (norm_type == 1) {
            r = SumChunk(p, len, [](double v) { return std::fabs(v); });
          } else {
            r = SumChunk(p, len, [&](double v) { return std::pow(std::fabs(v), norm_type); });
          }
        }
      });
      for (const NormPartial& r : partials) {
        if (inf_norm) {
          nan |= r.nan;
          acc = r.value > acc ? r.value : acc;
        } else {
          acc += r.value;
        }
      }
    });
  }
  double total;
  if (inf_norm) {
    total = nan ? std::nan("") : acc;
  } else if (norm_type == 1) {
    total = acc;
  } else if (norm_type == 2) {
    total = std::sqrt(acc);
  } else {
    total = std::pow(acc, 1.0 / norm_type);
  }
  norm.fill_(total);
  return KernelStatus::kDone;
}

KernelStatus ClipByNorm(const std::vector<RawTensor>& tensors, const RawTensor& total_norm,
                        double max_norm) {
  double clip_coef = 1;
  if (ClipCoefficient(total_norm.item(), max_norm, &clip_coef)) {
    for (const RawTensor& t : tensors) ScaleInPlace(t, clip_coef, false);
  }
  return KernelStatus::kDone;
}

}  // namespace tg::cpu
