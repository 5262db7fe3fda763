// The optimizer ops of tensor/ops.h (FusedAdam, FusedSgd, GlobalGradNorm, AddScaled and Lerp,
// NewtonSchulz, ClipByNorm): validation, then the device's kernel or the composed form.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tensor/composed.h"
#include "tensor/kernel_table.h"
#include "tensor/ops.h"
#include "tensor/ops_internal.h"

namespace tg {

using ops_internal::CheckDefined;
using ops_internal::CheckFloating;
using ops_internal::CommonDevice;
using ops_internal::Declined;
using ops_internal::IndicesI64;

using composed::ComputeDType;

// ---- Optimizer multi-tensor ops ----

namespace {

// Checks list `what` (`n` tensors, defined, floating, on `device`, of the shapes of `params`).
void CheckParamList(const char* op, const char* what, const std::vector<RawTensor>& list,
                    const std::vector<RawTensor>& params, Device device, bool allow_undefined) {
  TG_CHECK(list.size() == params.size(), op, ": ", what, " has ", list.size(),
           " tensors, params has ", params.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const RawTensor& t = list[i];
    if (allow_undefined && !t.defined()) continue;
    TG_CHECK(t.defined(), op, ": ", what, "[", i, "] is an undefined tensor");
    TG_CHECK(t.device() == device, op, ": ", what, "[", i, "] is on ", t.device().ToString(),
             ", params on ", device.ToString());
    TG_CHECK(IsFloating(t.dtype()), op, ": ", what, "[", i, "] has dtype ", DTypeName(t.dtype()),
             "; expected f32, f64, f16 or bf16");
    TG_CHECK(t.shape() == params[i].shape(), op, ": ", what, "[", i, "] has shape ",
             ShapeToString(t.shape()), ", its parameter ", ShapeToString(params[i].shape()));
  }
}

// State tensors hold the compute dtype of their parameter.
void CheckStateDTypes(const char* op, const char* what, const std::vector<RawTensor>& list,
                      const std::vector<RawTensor>& params) {
  for (size_t i = 0; i < list.size(); ++i) {
    const DType cd = ComputeDType(params[i].dtype());
    TG_CHECK(list[i].dtype() == cd, op, ": ", what, "[", i, "] is ", DTypeName(list[i].dtype()),
             "; expected ", DTypeName(cd), " for a ", DTypeName(params[i].dtype()), " parameter");
  }
}

// A one-element tensor of `dtype` on `device`, or undefined.
void CheckOptionalScalar(const char* op, const char* what, const RawTensor& t, Device device,
                         DType dtype) {
  if (!t.defined()) return;
  TG_CHECK(t.numel() == 1 && t.dtype() == dtype, op, ": ", what, " must be a one-element ",
           DTypeName(dtype), " tensor, got ", DTypeName(t.dtype()), " ", ShapeToString(t.shape()));
  TG_CHECK(t.device() == device, op, ": ", what, " is on ", t.device().ToString(), ", params on ",
           device.ToString());
}

}  // namespace

void FusedAdam(const AdamTensorLists& lists, const FusedAdamOptions& o) {
  const char* op = "FusedAdam";
  const std::vector<RawTensor>& params = lists.params;
  TG_CHECK(o.lr >= 0 && o.eps >= 0 && o.weight_decay >= 0 && o.beta1 >= 0 && o.beta1 < 1 &&
               o.beta2 >= 0 && o.beta2 < 1,
           op, ": invalid options lr ", o.lr, ", betas (", o.beta1, ", ", o.beta2, "), eps ", o.eps,
           ", weight_decay ", o.weight_decay);
  TG_CHECK(o.device_step.defined() || o.step >= 1, op,
           ": step must be >= 1 (the update's step number), got ", o.step);
  if (params.empty()) return;
  CheckDefined(op, params[0], "params[0]");
  const Device device = params[0].device();
  CheckParamList(op, "params", params, params, device, false);
  CheckParamList(op, "grads", lists.grads, params, device, false);
  CheckParamList(op, "exp_avgs", lists.exp_avgs, params, device, false);
  CheckParamList(op, "exp_avg_sqs", lists.exp_avg_sqs, params, device, false);
  CheckStateDTypes(op, "exp_avgs", lists.exp_avgs, params);
  CheckStateDTypes(op, "exp_avg_sqs", lists.exp_avg_sqs, params);
  if (o.amsgrad) {
    CheckParamList(op, "max_exp_avg_sqs (amsgrad)", lists.max_exp_avg_sqs, params, device, false);
    CheckStateDTypes(op, "max_exp_avg_sqs", lists.max_exp_avg_sqs, params);
  }
  if (!lists.model_params.empty()) {
    CheckParamList(op, "model_params", lists.model_params, params, device, true);
  }
  CheckOptionalScalar(op, "device_step", o.device_step, device, kF64);
  CheckOptionalScalar(op, "inv_scale", o.inv_scale, device, kF32);
  CheckOptionalScalar(op, "found_inf", o.found_inf, device, kF32);
  const KernelTable& kernels = KernelsFor(device);
  if (!Declined(kernels.FusedAdam(lists, o))) return;
  if (o.device_step.defined() || params.size() == 1) {
    composed::FusedAdam(lists, o);  // device_step moves once per call: no split
    return;
  }
  // A list the kernel declines as a whole may hold parameters it handles (f32 masters next to a
  // f64 parameter): each parameter on its own.
  for (size_t i = 0; i < params.size(); ++i) {
    AdamTensorLists one;
    one.params = {params[i]};
    one.grads = {lists.grads[i]};
    one.exp_avgs = {lists.exp_avgs[i]};
    one.exp_avg_sqs = {lists.exp_avg_sqs[i]};
    if (o.amsgrad) one.max_exp_avg_sqs = {lists.max_exp_avg_sqs[i]};
    if (!lists.model_params.empty()) one.model_params = {lists.model_params[i]};
    if (Declined(kernels.FusedAdam(one, o))) composed::FusedAdam(one, o);
  }
}

void FusedSgd(const SgdTensorLists& lists, const FusedSgdOptions& o) {
  const char* op = "FusedSgd";
  const std::vector<RawTensor>& params = lists.params;
  TG_CHECK(o.lr >= 0 && o.momentum >= 0 && o.weight_decay >= 0, op, ": invalid options lr ", o.lr,
           ", momentum ", o.momentum, ", weight_decay ", o.weight_decay);
  TG_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), op,
           ": nesterov momentum requires a momentum > 0 and zero dampening");
  if (params.empty()) return;
  CheckDefined(op, params[0], "params[0]");
  const Device device = params[0].device();
  CheckParamList(op, "params", params, params, device, false);
  CheckParamList(op, "grads", lists.grads, params, device, false);
  if (o.momentum != 0) {
    CheckParamList(op, "momentum_buffers", lists.momentum_buffers, params, device, false);
    CheckStateDTypes(op, "momentum_buffers", lists.momentum_buffers, params);
  }
  TG_CHECK(!o.momentum_buffers_valid.defined() || (o.momentum != 0 && !o.init_momentum_buffers), op,
           ": momentum_buffers_valid needs momentum != 0 and init_momentum_buffers false");
  CheckOptionalScalar(op, "momentum_buffers_valid", o.momentum_buffers_valid, device, kF32);
  CheckOptionalScalar(op, "found_inf", o.found_inf, device, kF32);
  if (Declined(KernelsFor(device).FusedSgd(lists, o))) composed::FusedSgd(lists, o);
}

RawTensor GlobalGradNorm(const std::vector<RawTensor>& tensors, double norm_type, DType dtype) {
  const char* op = "GlobalGradNorm";
  TG_CHECK(norm_type > 0, op, ": norm_type must be > 0 (or inf), got ", norm_type);
  TG_CHECK(dtype == kF64 || dtype == kF32, op, ": the norm's dtype must be f64 or f32, got ",
           DTypeName(dtype));
  TG_CHECK(!tensors.empty(), op, ": tensors is empty");
  for (size_t i = 0; i < tensors.size(); ++i) {
    CheckDefined(op, tensors[i], "a list element");
    CommonDevice(op, {&tensors[0], &tensors[i]});
    CheckFloating(op, tensors[i].dtype());
  }
  RawTensor norm = RawTensor::Empty({}, dtype, tensors[0].device());
  if (Declined(KernelsFor(norm.device()).GlobalGradNorm(norm, tensors, norm_type))) {
    composed::GlobalGradNorm(norm, tensors, norm_type);
  }
  return norm;
}

namespace {

// The checks of Addcmul and Lerp: defined floating inputs of one device, dtype and shape.
Device CheckFmaInputs(const char* op, std::initializer_list<const RawTensor*> inputs) {
  static const char* const kNames[] = {"the first input", "the second input", "the third input"};
  size_t k = 0;
  for (const RawTensor* t : inputs) CheckDefined(op, *t, kNames[k++]);
  const Device device = CommonDevice(op, inputs);
  const RawTensor& first = **inputs.begin();
  CheckFloating(op, first.dtype());
  for (const RawTensor* t : inputs) {
    TG_CHECK(t->dtype() == first.dtype() && t->shape() == first.shape(), op,
             ": expected inputs of one dtype and shape, got ", DTypeName(first.dtype()), " ",
             ShapeToString(first.shape()), " and ", DTypeName(t->dtype()), " ",
             ShapeToString(t->shape()));
  }
  return device;
}

// AddScaled's checks: a and b defined floating tensors of one device and shape, b of a's dtype
// or a narrower one that promotes to it.
Device CheckAddScaledInputs(const char* op, const RawTensor& a, const RawTensor& b) {
  CheckDefined(op, a, "the first input");
  CheckDefined(op, b, "the second input");
  const Device device = CommonDevice(op, {&a, &b});
  CheckFloating(op, a.dtype());
  CheckFloating(op, b.dtype());
  TG_CHECK(a.shape() == b.shape() && PromoteTypes(a.dtype(), b.dtype()) == a.dtype(), op,
           ": expected a second input of the first's shape and of its dtype or a narrower one, "
           "got ",
           DTypeName(a.dtype()), " ", ShapeToString(a.shape()), " and ", DTypeName(b.dtype()), " ",
           ShapeToString(b.shape()));
  return device;
}

}  // namespace

RawTensor AddScaled(const RawTensor& a, const RawTensor& b, double alpha) {
  const char* op = "add_scaled";
  const Device device = CheckAddScaledInputs(op, a, b);
  TG_CHECK(std::isfinite(alpha), op, ": alpha must be finite, got ", alpha);
  const RawTensor out = RawTensor::Empty(a.shape(), a.dtype(), device);
  if (Declined(KernelsFor(device).AddScaled(out, a.contiguous(), b.contiguous(), alpha, RawTensor(),
                                            1))) {
    // A device without the mixed form may have the fused one: b widened first (exact).
    return b.dtype() != a.dtype() ? AddScaled(a, b.to(a.dtype()), alpha)
                                  : composed::AddScaled(a, b, alpha);
  }
  return out;
}

RawTensor Addcmul(const RawTensor& self, const RawTensor& t1, const RawTensor& t2, double value) {
  const char* op = "addcmul";
  const Device device = CheckFmaInputs(op, {&self, &t1, &t2});
  TG_CHECK(std::isfinite(value), op, ": value must be finite, got ", value);
  const DType ct = ComputeDType(self.dtype());
  if (ct != self.dtype()) {  // f16/bf16: torch computes in f32 and rounds once at the end
    return Addcmul(self.to(ct), t1.to(ct), t2.to(ct), value).to(self.dtype());
  }
  const RawTensor scaled = MulScalar(t1, value).contiguous();
  const RawTensor out = RawTensor::Empty(self.shape(), self.dtype(), device);
  if (Declined(
          KernelsFor(device).AddScaled(out, self.contiguous(), t2.contiguous(), 1.0, scaled, 1))) {
    return composed::Addcmul(self, t1, t2, value);
  }
  return out;
}

RawTensor Lerp(const RawTensor& a, const RawTensor& b, double weight) {
  return Lerp(a, b, weight, a.defined() ? a.dtype() : kF32);
}

RawTensor Lerp(const RawTensor& a, const RawTensor& b, double weight, DType dtype) {
  const char* op = "lerp";
  const Device device = CheckFmaInputs(op, {&a, &b});
  TG_CHECK(std::isfinite(weight), op, ": weight must be finite, got ", weight);
  CheckFloating(op, dtype);
  const RawTensor out = RawTensor::Empty(a.shape(), dtype, device);
  if (Declined(KernelsFor(device).Lerp(out, a.contiguous(), b.contiguous(), weight))) {
    // A device without the mixed form may have the one-dtype kernel: then the cast.
    return dtype == a.dtype() ? composed::Lerp(a, b, weight) : Lerp(a, b, weight).to(dtype);
  }
  return out;
}

namespace {

// Whether `self` can be written by a kernel reading `other` in the same pass: self contiguous,
// and other either in another storage or exactly self's elements (an elementwise kernel reads
// each element before it writes it; a shifted view of the same storage would read written ones).
bool WritableInOnePass(const RawTensor& self, const RawTensor& other) {
  if (!self.is_contiguous()) return false;
  if (self.storage() != other.storage()) return true;
  return other.is_contiguous() && other.raw_data() == self.raw_data();
}

}  // namespace

void AddScaledInPlace(const RawTensor& self, const RawTensor& b, double alpha, double self_scale) {
  const char* op = "add_scaled_";
  const Device device = CheckAddScaledInputs(op, self, b);
  TG_CHECK(std::isfinite(alpha), op, ": alpha must be finite, got ", alpha);
  TG_CHECK(std::isfinite(self_scale), op, ": self_scale must be finite, got ", self_scale);
  const KernelTable& kernels = KernelsFor(device);
  // A b in self's storage must see self scaled first: then two passes.
  if (WritableInOnePass(self, b) && (self_scale == 1 || self.storage() != b.storage()) &&
      !Declined(kernels.AddScaled(self, self, b.contiguous(), alpha, RawTensor(), self_scale))) {
    return;
  }
  if (self_scale != 1) MulScalarInPlace({self}, self_scale);
  if (!WritableInOnePass(self, b) ||
      Declined(kernels.AddScaled(self, self, b.contiguous(), alpha, RawTensor(), 1))) {
    self.copy_(AddScaled(self, b, alpha));
  }
}

void LerpInPlace(const RawTensor& self, const RawTensor& end, double weight) {
  const char* op = "lerp_";
  const Device device = CheckFmaInputs(op, {&self, &end});
  TG_CHECK(std::isfinite(weight), op, ": weight must be finite, got ", weight);
  if (!WritableInOnePass(self, end) ||
      Declined(KernelsFor(device).Lerp(self, self, end.contiguous(), weight))) {
    self.copy_(Lerp(self, end, weight));
  }
}

RawTensor NewtonSchulz(const RawTensor& x, double a, double b, double c, int64_t ns_steps,
                       double eps) {
  const char* op = "newton_schulz";
  CheckDefined(op, x, "the input");
  CheckFloating(op, x.dtype());
  TG_CHECK(x.dtype() != kF8E4M3 && x.dtype() != kF8E5M2, op,
           ": takes bf16, f16, f32 or f64 matrices, got ", DTypeName(x.dtype()));
  TG_CHECK(x.dim() == 3, op, ": expected a batch of matrices [batch, m, n], got ",
           ShapeToString(x.shape()));
  TG_CHECK(x.size(1) <= x.size(2), op,
           ": expected wide matrices (m <= n; transpose a tall one), got ",
           ShapeToString(x.shape()));
  TG_CHECK(ns_steps >= 0 && ns_steps < 100, op, ": ns_steps must be in 0..99, got ", ns_steps);
  TG_CHECK(std::isfinite(a) && std::isfinite(b) && std::isfinite(c), op,
           ": the coefficients must be finite, got (", a, ", ", b, ", ", c, ")");
  TG_CHECK(std::isfinite(eps) && eps >= 0, op, ": eps must be finite and >= 0, got ", eps);
  const RawTensor in = x.contiguous();
  const RawTensor out = RawTensor::Empty(x.shape(), x.dtype(), x.device());
  if (Declined(KernelsFor(x.device()).NewtonSchulz(out, in, a, b, c, ns_steps, eps))) {
    return composed::NewtonSchulz(in, a, b, c, ns_steps, eps);
  }
  return out;
}

void ClipByNorm(const std::vector<RawTensor>& tensors, const RawTensor& total_norm,
                double max_norm) {
  const char* op = "ClipByNorm";
  TG_CHECK(max_norm >= 0, op, ": max_norm must be >= 0, got ", max_norm);
  CheckDefined(op, total_norm, "total_norm");
  TG_CHECK(total_norm.numel() == 1 && (total_norm.dtype() == kF64 || total_norm.dtype() == kF32),
           op, ": total_norm must be a one-element f64 or f32 tensor, got ",
           DTypeName(total_norm.dtype()), " ", ShapeToString(total_norm.shape()));
  if (tensors.empty()) return;
  for (const RawTensor& t : tensors) {
    CheckDefined(op, t, "a list element");
    CommonDevice(op, {&total_norm, &t});
    CheckFloating(op, t.dtype());
  }
  if (Declined(KernelsFor(total_norm.device()).ClipByNorm(tensors, total_norm, max_norm))) {
    composed::ClipByNorm(tensors, total_norm, max_norm);
  }
}

}  // namespace tg
