#include "train/fp8_setup.h"

#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/internal/parse.h"
#include "absl/strings/str_cat.h"
#include "train/flags.h"

namespace tg::train {

absl::StatusOr<std::unique_ptr<amp::Fp8Training>> MakeFp8Training(
    const Precision& precision, std::vector<Tensor> weights,
    amp::Fp8DelayedScaling::AmaxReducer reducer) {
  const std::string recipe = absl::GetFlag(FLAGS_fp8_recipe);
  const int64_t history = absl::GetFlag(FLAGS_fp8_amax_history_len);
  const int64_t margin = absl::GetFlag(FLAGS_fp8_margin);
  if (!precision.fp8) {
    // A recipe asked for but not used would leave the run in bf16 without saying so: a flag
    // given on the command line, even at its default value, or changed by the program.
    // (This absl keeps CommandLineFlag::IsSpecifiedOnCommandLine private; the parser's own
    // record is flags_internal::WasPresentOnCommandLine.)
    auto given = [](const char* name, bool changed) {
      return changed || absl::flags_internal::WasPresentOnCommandLine(name);
    };
    const char* changed = given("fp8_recipe", recipe != "delayed") ? "--fp8_recipe"
                          : given("fp8_amax_history_len", history != 1024)
                              ? "--fp8_amax_history_len"
                          : given("fp8_margin", margin != 0) ? "--fp8_margin"
                                                             : nullptr;
    if (changed != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(changed, " is set, but --precision=", absl::GetFlag(FLAGS_precision),
                       " does not train in FP8 (use --precision=fp8)"));
    }
    return std::unique_ptr<amp::Fp8Training>();
  }
  if (history < 1 || history > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fp8_amax_history_len=", history, " is outside its valid range [1, 65536]"));
  }
  if (margin < -64 || margin > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fp8_margin=", margin, " is outside its valid range [-64, 64]"));
  }
  amp::Fp8TrainingOptions options;
  try {
    options.recipe = amp::ParseFp8Recipe(recipe);
  } catch (const Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("--fp8_recipe: ", e.what()));
  }
  options.delayed.amax_history_len = history;
  options.delayed.margin = static_cast<int>(margin);
  auto fp8 = std::make_unique<amp::Fp8Training>(std::move(weights), options);
  fp8->set_amax_reducer(std::move(reducer));
  return fp8;
}

StateDict Fp8State(const amp::Fp8Training* fp8) {
  StateDict sd;
  if (fp8 != nullptr) sd.Merge("fp8.", fp8->state_dict());
  return sd;
}

absl::Status LoadFp8State(const StateDict& checkpoint, const std::string& dir,
                          amp::Fp8Training& fp8) {
  try {
    fp8.load_state_dict(checkpoint.Sub("fp8."));
  } catch (const Error& e) {
    return absl::DataLossError(
        absl::StrCat("cannot resume from ", dir, ": its FP8 state: ", e.what()));
  }
  return absl::OkStatus();
}

void AddPrecisionSettings(const Precision& precision, RunSettings& settings,
                          const std::vector<std::pair<std::string, std::string>>& fp8_settings) {
  settings.Add("precision", absl::GetFlag(FLAGS_precision), /*fixed=*/true);
  if (precision.fp8) {
    settings.Add("fp8_recipe", absl::GetFlag(FLAGS_fp8_recipe), true);
    settings.Add("fp8_amax_history_len",
                 static_cast<double>(absl::GetFlag(FLAGS_fp8_amax_history_len)), true);
    settings.Add("fp8_margin", static_cast<double>(absl::GetFlag(FLAGS_fp8_margin)), true);
    for (const auto& [name, value] : fp8_settings) settings.Add(name, value, true);
  }
  settings.Add("loss_scaler", absl::GetFlag(FLAGS_loss_scaler), true);
  settings.Add("optimizer", absl::GetFlag(FLAGS_optimizer), true);
  if (absl::GetFlag(FLAGS_optimizer) == "muon") {  // its lr may change on resume (--override)
    settings.Add("muon_lr", absl::GetFlag(FLAGS_muon_lr), /*fixed=*/false);
    settings.Add("muon_momentum", absl::GetFlag(FLAGS_muon_momentum), true);
    settings.Add("muon_nesterov", absl::GetFlag(FLAGS_muon_nesterov) ? "yes" : "no", true);
    settings.Add("muon_ns_steps", static_cast<double>(absl::GetFlag(FLAGS_muon_ns_steps)), true);
    settings.Add("muon_adjust_lr", absl::GetFlag(FLAGS_muon_adjust_lr), true);
  }
}

std::vector<std::string> WithFp8Columns(std::vector<std::string> columns,
                                        const amp::Fp8Training* fp8) {
  if (fp8 == nullptr) return columns;
  for (const std::string& c : Fp8MetricsColumns()) columns.push_back(c);
  return columns;
}

std::vector<std::string> Fp8MetricsColumns() {
  return {"fp8_input_scale", "fp8_weight_scale", "fp8_grad_scale"};
}

void AddFp8Metrics(const amp::Fp8Training& fp8, std::map<std::string, double>& extras) {
  const std::vector<std::string> columns = Fp8MetricsColumns();
  const amp::Fp8Role roles[] = {amp::Fp8Role::kInput, amp::Fp8Role::kWeight,
                                amp::Fp8Role::kGradOutput};
  for (size_t i = 0; i < columns.size(); ++i) {
    extras[columns[i]] = fp8.Summary(roles[i]).min_scale;
  }
}

}  // namespace tg::train
