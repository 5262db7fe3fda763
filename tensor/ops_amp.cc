// The mixed-precision ops of tensor/ops.h: the non-finite check (with unscaling) over tensor
// lists, and the loss-scale state that lives on the device.
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

bool AnyNonFinite(const std::vector<RawTensor>& tensors) {
  bool found = false;
  for (const RawTensor& t : tensors) {
    CheckDefined("non_finite_check", t, "a list element");
    CommonDevice("non_finite_check", {&t});
    if (IsFloating(t.dtype()))
      found = found || KernelsFor(t.device()).AnyNonFinite(t);  // integers are finite
  }
  return found;
}

void MulScalarInPlace(const std::vector<RawTensor>& tensors, double scale) {
  for (const RawTensor& t : tensors) {
    CheckDefined("mul_scalar_", t, "a list element");
    CommonDevice("mul_scalar_", {&t});
    CheckFloating("mul_scalar_", t.dtype());
  }
  for (const RawTensor& t : tensors) KernelsFor(t.device()).ScaleInPlace(t, scale, false);
}

void NonFiniteCheckAndUnscale(const std::vector<RawTensor>& tensors, const RawTensor& found_inf,
                              const RawTensor& inv_scale) {
  const char* op = "non_finite_check_and_unscale";
  CheckDefined(op, found_inf, "found_inf");
  CheckDefined(op, inv_scale, "inv_scale");
  TG_CHECK(found_inf.numel() == 1 && found_inf.dtype() == kF32, op,
           ": found_inf must be a one-element f32 tensor, got ", DTypeName(found_inf.dtype()), " ",
           ShapeToString(found_inf.shape()));
  TG_CHECK(inv_scale.numel() == 1 && inv_scale.dtype() == kF32, op,
           ": inv_scale must be a one-element f32 tensor, got ", DTypeName(inv_scale.dtype()), " ",
           ShapeToString(inv_scale.shape()));
  for (const RawTensor& t : tensors) {
    CheckDefined(op, t, "a list element");
    CommonDevice(op, {&t, &found_inf, &inv_scale});
    CheckFloating(op, t.dtype());
  }
  // The kernels take a non-empty list of contiguous, non-empty tensors: empty ones have nothing
  // to scale, and a strided one is scaled in a contiguous copy that is written back.
  std::vector<RawTensor> dense;
  std::vector<std::pair<RawTensor, RawTensor>> write_back;  // {view, its contiguous copy}
  for (const RawTensor& t : tensors) {
    if (t.numel() == 0) continue;
    if (t.is_contiguous()) {
      dense.push_back(t);
    } else {
      write_back.emplace_back(t, t.clone());
      dense.push_back(write_back.back().second);
    }
  }
  if (dense.empty()) return;
  if (KernelsFor(found_inf.device()).NonFiniteCheckAndUnscale(dense, found_inf, inv_scale) !=
      KernelStatus::kDone) {
    composed::NonFiniteCheckAndUnscale(dense, found_inf, inv_scale);
  }
  for (const auto& [view, copy] : write_back) view.copy_(copy);
}

// ---- Loss scale ----

namespace {

constexpr int64_t kLossScaleStateBytes = static_cast<int64_t>(sizeof(LossScaleState));

void CheckLossScaleState(const char* op, const RawTensor& state) {
  CheckDefined(op, state, "the loss-scale state");
  TG_CHECK(
      state.dtype() == kU8 && state.shape() == Shape{kLossScaleStateBytes} && state.is_contiguous(),
      op, ": expected the loss-scale state of LossScaleStateTensor (contiguous u8 [",
      kLossScaleStateBytes, "]), got ", DTypeName(state.dtype()), " ",
      ShapeToString(state.shape()));
}

// A one-element f32 tensor on the state's device, or undefined.
void CheckScaleScalar(const char* op, const char* what, const RawTensor& t,
                      const RawTensor& state) {
  if (!t.defined()) return;
  CommonDevice(op, {&state, &t});
  TG_CHECK(t.numel() == 1 && t.dtype() == kF32 && t.is_contiguous(), op, ": ", what,
           " must be a one-element f32 tensor, got ", DTypeName(t.dtype()), " ",
           ShapeToString(t.shape()));
}

}  // namespace

RawTensor LossScaleStateTensor(const LossScaleState& state, Device device) {
  RawTensor host = RawTensor::Empty({kLossScaleStateBytes}, kU8);
  std::memcpy(host.raw_data(), &state, sizeof(state));
  return host.to(device);  // the bytes, copied to where they live (host itself on the CPU)
}

LossScaleState ReadLossScaleState(const RawTensor& state) {
  CheckLossScaleState("read_loss_scale_state", state);
  const RawTensor host = state.to(Device());
  LossScaleState s;
  std::memcpy(&s, host.raw_data(), sizeof(s));
  return s;
}

void StepLossScale(const RawTensor& state, const RawTensor& found_inf, const RawTensor& scale,
                   const RawTensor& inv_scale) {
  const char* op = "step_loss_scale";
  CheckLossScaleState(op, state);
  CheckScaleScalar(op, "found_inf", found_inf, state);
  CheckScaleScalar(op, "scale", scale, state);
  CheckScaleScalar(op, "inv_scale", inv_scale, state);
  // Every device implements it (no composed form: the state machine is not made of tensor ops).
  TG_CHECK(
      !Declined(KernelsFor(state.device()).LossScaleStep(state, found_inf, true, scale, inv_scale)),
      op, ": no kernel on ", state.device().ToString());
}

void WriteLossScale(const RawTensor& state, const RawTensor& scale, const RawTensor& inv_scale) {
  const char* op = "write_loss_scale";
  CheckLossScaleState(op, state);
  CheckScaleScalar(op, "scale", scale, state);
  CheckScaleScalar(op, "inv_scale", inv_scale, state);
  TG_CHECK(
      !Declined(
          KernelsFor(state.device()).LossScaleStep(state, RawTensor(), false, scale, inv_scale)),
      op, ": no kernel on ", state.device().ToString());
}

}  // namespace tg
