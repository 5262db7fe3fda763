#include "amp/fp8_recipe.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/error.h"
#include "tensor/fp8_scale.h"

namespace tg {
namespace amp {
namespace {

constexpr Fp8Role kRoles[] = {Fp8Role::kInput, Fp8Role::kWeight, Fp8Role::kGradOutput};
constexpr int64_t kTile = 128;

// fmaxf as the CUDA kernels use it: a NaN operand is skipped.
float MaxSkippingNan(float a, float b) { return std::fmax(a, b); }

std::string HistoryKey(int64_t layer, Fp8Role role) {
  return absl::StrCat("layer.", layer, ".", Fp8RoleName(role), ".amax_history");
}
std::string ScaleKey(int64_t layer, Fp8Role role) {
  return absl::StrCat("layer.", layer, ".", Fp8RoleName(role), ".scale");
}

}  // namespace

const char* Fp8FormatName(Fp8Format format) {
  switch (format) {
    case Fp8Format::kE4M3:
      return "E4M3";
    case Fp8Format::kE5M2:
      return "E5M2";
    case Fp8Format::kHybrid:
      return "HYBRID";
  }
  return "?";
}

const char* Fp8RoleName(Fp8Role role) {
  switch (role) {
    case Fp8Role::kInput:
      return "input";
    case Fp8Role::kWeight:
      return "weight";
    case Fp8Role::kGradOutput:
      return "grad_output";
  }
  return "?";
}

float Fp8Max(Fp8Format format, Fp8Role role) {
  switch (format) {
    case Fp8Format::kE4M3:
      return kE4M3Max;
    case Fp8Format::kE5M2:
      return kE5M2Max;
    case Fp8Format::kHybrid:
      return role == Fp8Role::kGradOutput ? kE5M2Max : kE4M3Max;
  }
  return kE4M3Max;
}

float ComputeScaleFromAmax(float amax, float fp8_max, const Fp8CurrentScalingOptions& options) {
  TG_CHECK(std::isfinite(options.amax_epsilon) && options.amax_epsilon >= 0.0f,
           "ComputeScaleFromAmax: amax_epsilon must be finite and >= 0, got ",
           options.amax_epsilon);
  TG_CHECK(std::isfinite(fp8_max) && fp8_max > 0.0f,
           "ComputeScaleFromAmax: fp8_max must be finite and > 0, got ", fp8_max);
  TG_CHECK(std::isfinite(options.value_for_inf) && options.value_for_inf > 0.0f,
           "ComputeScaleFromAmax: value_for_inf must be finite and > 0, got ",
           options.value_for_inf);
  // The rule itself is tensor/fp8_scale.h's, which the Fp8Scale kernels of every device run too.
  Fp8ScaleOptions o;
  o.fp8_max = fp8_max;
  o.amax_epsilon = options.amax_epsilon;
  o.force_pow_2_scales = options.force_pow_2_scales;
  o.value_for_inf = options.value_for_inf;
  return Fp8ScaleFromAmax(amax, o);
}

Fp8CurrentScalingOptions BlockScalingDefaults() {
  Fp8CurrentScalingOptions o;
  o.force_pow_2_scales = true;
  return o;
}

Fp8BlockScales ComputeBlockScales(const std::vector<float>& values, int64_t rows, int64_t cols,
                                  Fp8BlockShape shape, float fp8_max,
                                  const Fp8CurrentScalingOptions& options) {
  TG_CHECK(rows >= 0 && cols >= 0, "ComputeBlockScales: negative shape [", rows, ", ", cols, "]");
  TG_CHECK(static_cast<int64_t>(values.size()) == rows * cols,
           "ComputeBlockScales: ", values.size(), " values for shape [", rows, ", ", cols, "]");
  const int64_t tile_rows = shape == Fp8BlockShape::k1x128 ? 1 : kTile;
  Fp8BlockScales out;
  out.grid_rows = (rows + tile_rows - 1) / tile_rows;
  out.grid_cols = (cols + kTile - 1) / kTile;
  out.amaxes.assign(static_cast<size_t>(out.grid_rows * out.grid_cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float* grid_row = out.amaxes.data() + (r / tile_rows) * out.grid_cols;
    const float* row = values.data() + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      grid_row[c / kTile] = MaxSkippingNan(grid_row[c / kTile], std::fabs(row[c]));
    }
  }
  out.scales.resize(out.amaxes.size());
  for (size_t i = 0; i < out.amaxes.size(); ++i) {
    out.scales[i] = ComputeScaleFromAmax(out.amaxes[i], fp8_max, options);
  }
  return out;
}

Fp8BlockScales ComputeBlockScales(const RawTensor& x, Fp8BlockShape shape, float fp8_max,
                                  const Fp8CurrentScalingOptions& options) {
  TG_CHECK(x.dim() == 2, "ComputeBlockScales: expected a 2-D tensor, got shape ",
           ShapeToString(x.shape()));
  TG_CHECK(x.dtype() == kF32, "ComputeBlockScales: expected an f32 tensor, got ",
           DTypeName(x.dtype()));
  TG_CHECK(x.device().is_cpu(), "ComputeBlockScales: expected a CPU tensor, got ",
           x.device().ToString());
  return ComputeBlockScales(x.to_vector<float>(), x.shape()[0], x.shape()[1], shape, fp8_max,
                            options);
}

void Fp8TensorScaling::Update(float amax, AmaxComputeAlgo algo, float fp8_max, int margin) {
  const size_t length = amax_history.size();
  const float last = amax != 0.0f ? amax : amax_history[0];
  float window_amax = 0.0f;
  if (last != 0.0f) {
    // Roll: h[i] <- h[i + 1], the last slot gets this step's amax, the first slot (the next
    // step's record) is cleared. The window's max covers what was rolled through, h[1] included.
    for (size_t i = 0; i < length; ++i) {
      const float a = i + 1 < length ? amax_history[i + 1] : last;
      window_amax = MaxSkippingNan(window_amax, a);
      amax_history[i] = i > 0 ? a : 0.0f;
    }
  }
  const float used = algo == AmaxComputeAlgo::kMostRecent ? last : window_amax;
  // f32 like TE: scaled_max = fp8_max * 2^-margin (exact for the allowed margins), one division.
  const float scaled_max = fp8_max * std::pow(2.0f, static_cast<float>(-margin));
  float next = (std::isfinite(used) && used > 0.0f) ? scaled_max / used : scale;
  if (std::isinf(next)) next = std::numeric_limits<float>::max();
  scale = next;
}

Fp8DelayedScaling::Fp8DelayedScaling(int64_t num_layers, const Options& options)
    : num_layers_(num_layers), options_(options) {
  TG_CHECK(num_layers >= 1, "Fp8DelayedScaling: num_layers must be >= 1, got ", num_layers);
  TG_CHECK(options.format != Fp8Format::kE5M2,
           "Fp8DelayedScaling: format E5M2 is not supported (pure E5M2 training; use E4M3 or "
           "HYBRID, as Transformer Engine requires)");
  TG_CHECK(options.amax_history_len >= 1, "Fp8DelayedScaling: amax_history_len must be >= 1, got ",
           options.amax_history_len);
  TG_CHECK(options.margin >= -64 && options.margin <= 64,
           "Fp8DelayedScaling: margin must be in [-64, 64], got ", options.margin);
  Fp8TensorScaling initial;
  initial.amax_history.assign(static_cast<size_t>(options.amax_history_len), 0.0f);
  tensors_.assign(static_cast<size_t>(num_layers * 3), initial);
}

const Fp8TensorScaling& Fp8DelayedScaling::tensor(int64_t layer, Fp8Role role) const {
  TG_CHECK(layer >= 0 && layer < num_layers_, "Fp8DelayedScaling: layer ", layer,
           " out of range [0, ", num_layers_, ")");
  return tensors_[static_cast<size_t>(layer * 3 + static_cast<int>(role))];
}

void Fp8DelayedScaling::UpdateForward(const std::vector<float>& local_amaxes,
                                      const AmaxReducer& reduce_max) {
  Update("Fp8DelayedScaling::UpdateForward", {Fp8Role::kInput, Fp8Role::kWeight}, local_amaxes,
         reduce_max);
}

void Fp8DelayedScaling::UpdateBackward(const std::vector<float>& local_amaxes,
                                       const AmaxReducer& reduce_max) {
  Update("Fp8DelayedScaling::UpdateBackward", {Fp8Role::kGradOutput}, local_amaxes, reduce_max);
}

void Fp8DelayedScaling::Update(const char* op, const std::vector<Fp8Role>& roles,
                               const std::vector<float>& local_amaxes,
                               const AmaxReducer& reduce_max) {
  const size_t expected = static_cast<size_t>(num_layers_) * roles.size();
  TG_CHECK(local_amaxes.size() == expected, op, ": expected ", expected, " amaxes (", roles.size(),
           " per layer, ", num_layers_, " layers), got ", local_amaxes.size());
  std::vector<float> amaxes = local_amaxes;
  // The data-parallel reduction comes before any scale moves: every rank then updates from the
  // same amaxes and keeps identical scales.
  if (options_.reduce_amax && reduce_max) {
    reduce_max(amaxes);
    TG_CHECK(amaxes.size() == expected, op, ": the amax reducer changed the count from ", expected,
             " to ", amaxes.size());
  }
  for (size_t i = 0; i < amaxes.size(); ++i) {
    TG_CHECK(!(amaxes[i] < 0.0f), op, ": amax ", i, " is ", amaxes[i],
             " (amaxes are absolute values: >= 0, inf or NaN)");
  }
  for (size_t i = 0; i < amaxes.size(); ++i) {
    const int64_t layer = static_cast<int64_t>(i / roles.size());
    const Fp8Role role = roles[i % roles.size()];
    tensors_[static_cast<size_t>(layer * 3 + static_cast<int>(role))].Update(
        amaxes[i], options_.amax_compute_algo, fp8_max(role), options_.margin);
  }
}

StateDict Fp8DelayedScaling::state_dict() const {
  StateDict sd;
  for (int64_t layer = 0; layer < num_layers_; ++layer) {
    for (Fp8Role role : kRoles) {
      const Fp8TensorScaling& t = tensor(layer, role);
      sd.scalars[ScaleKey(layer, role)] = t.scale;
      sd.tensors[HistoryKey(layer, role)] = RawTensor::FromVector<float>(
          t.amax_history, {static_cast<int64_t>(t.amax_history.size())});
    }
  }
  return sd;
}

void Fp8DelayedScaling::load_state_dict(const StateDict& state) {
  static constexpr char kOp[] = "Fp8DelayedScaling::load_state_dict: ";
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
  const StateDict reference = state_dict();
  for (const auto& [key, value] : reference.scalars) {
    if (!state.has_scalar(key)) missing.push_back(absl::StrCat("scalar '", key, "'"));
  }
  for (const auto& [key, value] : reference.tensors) {
    if (!state.has_tensor(key)) missing.push_back(absl::StrCat("tensor '", key, "'"));
  }
  for (const auto& [key, value] : state.scalars) {
    if (!reference.has_scalar(key)) unexpected.push_back(absl::StrCat("scalar '", key, "'"));
  }
  for (const auto& [key, value] : state.tensors) {
    if (!reference.has_tensor(key)) unexpected.push_back(absl::StrCat("tensor '", key, "'"));
  }
  TG_CHECK(missing.empty() && unexpected.empty(), kOp,
           missing.empty() ? "" : absl::StrCat("missing ", absl::StrJoin(missing, ", ")),
           !missing.empty() && !unexpected.empty() ? "; " : "",
           unexpected.empty() ? "" : absl::StrCat("unexpected ", absl::StrJoin(unexpected, ", ")),
           " (for ", num_layers_,
           " layer(s): 'layer.<i>.<input|weight|grad_output>.scale' and '.amax_history')");

  // Validate everything before changing anything.
  std::vector<Fp8TensorScaling> loaded = tensors_;
  const int64_t length = options_.amax_history_len;
  for (int64_t layer = 0; layer < num_layers_; ++layer) {
    for (Fp8Role role : kRoles) {
      Fp8TensorScaling& t = loaded[static_cast<size_t>(layer * 3 + static_cast<int>(role))];
      const std::string scale_key = ScaleKey(layer, role);
      const double scale = state.scalar(scale_key);
      TG_CHECK(std::isfinite(scale) && scale > 0.0, kOp, "'", scale_key,
               "' must be a finite positive scale, got ", scale);
      TG_CHECK(static_cast<double>(static_cast<float>(scale)) == scale, kOp, "'", scale_key,
               "' must be an f32 value, got ", absl::StrCat(scale));
      t.scale = static_cast<float>(scale);

      const std::string history_key = HistoryKey(layer, role);
      const RawTensor& h = state.tensor(history_key);
      TG_CHECK(h.dtype() == kF32 && h.dim() == 1 && h.shape()[0] == length, kOp, "'", history_key,
               "' must be an f32 tensor of shape [", length, "] (amax_history_len), got ",
               DTypeName(h.dtype()), " ", ShapeToString(h.shape()));
      TG_CHECK(h.device().is_cpu(), kOp, "'", history_key, "' must be on the CPU, got ",
               h.device().ToString());
      t.amax_history = h.to_vector<float>();
      for (int64_t i = 0; i < length; ++i) {
        TG_CHECK(!(t.amax_history[static_cast<size_t>(i)] < 0.0f), kOp, "'", history_key,
                 "' entry ", i, " is ", t.amax_history[static_cast<size_t>(i)],
                 " (amaxes are >= 0, inf or NaN)");
      }
    }
  }
  tensors_ = std::move(loaded);
}

}  // namespace amp
}  // namespace tg
