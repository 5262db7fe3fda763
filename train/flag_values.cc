#include "train/flag_values.h"

#include <algorithm>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tensor/device_backend.h"
#include "tensor/error.h"
#include "train/format_number.h"

namespace tg::train {

absl::StatusOr<Device> CheckDevice(const std::string& device) {
  const std::optional<Device> d = Device::Parse(device);
  if (!d) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", device, ": expected ", Device::Specs()));
  }
  if (d->is_cpu()) return *d;
  try {
    GetDeviceBackend(d->type)->allocator(d->index);  // throws naming why not
  } catch (const Error& e) {
    return absl::FailedPreconditionError(absl::StrCat("--device=", device, ": ", e.what()));
  }
  return *d;
}

absl::StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "f32") return Precision{kF32, false};
  if (name == "f16") return Precision{kF16, false};
  if (name == "bf16") return Precision{kBF16, false};
  if (name == "fp8") return Precision{kBF16, true};
  return absl::InvalidArgumentError(
      absl::StrCat("unknown precision '", name, "' (expected f32, f16, bf16 or fp8)"));
}

absl::Status CheckFlagRanges(const std::vector<FlagRange>& flags) {
  for (const FlagRange& f : flags) {
    const bool min_open = f.open == FlagRange::Open::kMin;
    const bool max_open = f.open == FlagRange::Open::kMax;
    const bool ok = (min_open ? f.value > f.min : f.value >= f.min) &&
                    (max_open ? f.value < f.max : f.value <= f.max);
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", f.name, "=", FormatNumber(f.value), " is outside its valid range ",
                       min_open ? "(" : "[", FormatNumber(f.min), ", ", FormatNumber(f.max),
                       max_open ? ")" : "]"));
    }
  }
  return absl::OkStatus();
}

int64_t DefaultWarmupSteps(int64_t steps) { return steps >= 100 ? 100 : steps / 10; }

double DefaultMinLr(double lr) { return lr >= 3e-4 ? 3e-4 : lr / 10; }

std::string BatchSizes::Describe(const char* rows) const {
  return absl::StrCat("batch: global ", global, " ", rows, " per optimizer step = micro-batch ",
                      micro, " x ", grad_accum_steps, " accumulation step",
                      grad_accum_steps == 1 ? "" : "s", " x ", world_size,
                      world_size == 1 ? " rank" : " ranks");
}

absl::StatusOr<BatchSizes> ResolveBatchSizes(std::optional<int64_t> batch_size,
                                             std::optional<int64_t> micro_batch_size,
                                             int64_t default_batch_size, int64_t grad_accum_steps,
                                             int64_t world_size) {
  BatchSizes b;
  b.grad_accum_steps = grad_accum_steps;
  b.world_size = world_size;
  if (grad_accum_steps < 1 || world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the batch splits into --grad_accum_steps x ranks micro-batches, which need "
                     "to be >= 1: got ",
                     grad_accum_steps, " x ", world_size));
  }
  const int64_t parts = grad_accum_steps * world_size;  // micro-batches per optimizer step
  const std::string split =
      absl::StrCat("--grad_accum_steps=", grad_accum_steps, " x --world_size=", world_size);
  if (micro_batch_size.has_value()) {
    b.micro = *micro_batch_size;
    b.global = b.micro * parts;
    if (batch_size.has_value() && *batch_size != b.global) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--batch_size=", *batch_size, " (the global batch of an optimizer step) is not ",
          "--micro_batch_size=", b.micro, " x ", split, " = ", b.global, "; give one of the two"));
    }
    return b;
  }
  if (batch_size.has_value()) {
    if (*batch_size % parts != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--batch_size=", *batch_size,
                       " (the global batch of an optimizer step) does not split into ", split,
                       " = ", parts, " equal micro-batches: give a multiple of ", parts,
                       ", or --micro_batch_size=N for N x ", parts, " rows per step"));
    }
    b.global = *batch_size;
  } else {
    // The default never fails: rounded down to a multiple of the micro-batch count.
    b.global = std::max(parts, default_batch_size - default_batch_size % parts);
  }
  b.micro = b.global / parts;
  return b;
}

}  // namespace tg::train
