// --precision=fp8 in the training binaries: the FP8 training (amp/fp8.h) of a model's Linear
// weights from the --fp8_* flags, and its scales as metrics columns.
//
//   absl::StatusOr<std::unique_ptr<amp::Fp8Training>> fp8 =
//       train::MakeFp8Training(precision, nn::LinearWeights(*model), dp.AmaxReducer());
//   train::TrainStep(opt, schedule, {precision.dtype, fp8->get()}, ...);
#ifndef TAPEGRAD_TRAIN_FP8_SETUP_H_
#define TAPEGRAD_TRAIN_FP8_SETUP_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "amp/fp8.h"
#include "autograd/variable.h"
#include "tensor/state_dict.h"
#include "train/flag_values.h"
#include "train/run_settings.h"

namespace tg::train {

// The FP8 training of `weights` with --fp8_recipe (and, for delayed scaling,
// --fp8_amax_history_len, --fp8_margin; amaxes reduced with `reducer`, null for one process),
// or nullptr when !precision.fp8. InvalidArgument for an unknown recipe, a flag outside its range,
// or an --fp8_* flag changed from its default without --precision=fp8.
absl::StatusOr<std::unique_ptr<amp::Fp8Training>> MakeFp8Training(
    const Precision& precision, std::vector<Tensor> weights,
    amp::Fp8DelayedScaling::AmaxReducer reducer);

// What a checkpoint holds of an FP8 run: fp8->state_dict() under "fp8." (empty for nullptr),
// the `extra` entries of RunState::Save.
StateDict Fp8State(const amp::Fp8Training* fp8);
// Restores Fp8State's entries from a resumed checkpoint; DataLoss naming `dir` and the reason
// (another recipe or layer count, a bad value) otherwise, with `fp8` unchanged.
absl::Status LoadFp8State(const StateDict& checkpoint, const std::string& dir,
                          amp::Fp8Training& fp8);

// The precision settings of the run, all fixed on resume and all from the shared flags:
// precision, then for FP8 fp8_recipe, fp8_amax_history_len, fp8_margin and the model's own
// `fp8_settings` (name, value), then loss_scaler and optimizer (with muon its --muon_* settings,
// of which muon_lr may change on resume).
void AddPrecisionSettings(
    const Precision& precision, RunSettings& settings,
    const std::vector<std::pair<std::string, std::string>>& fp8_settings = {});

// `columns` followed by Fp8MetricsColumns() when fp8 is an FP8 run's training (not null).
std::vector<std::string> WithFp8Columns(std::vector<std::string> columns,
                                        const amp::Fp8Training* fp8);

// The metrics columns of an FP8 run: the smallest scale of each role over the layers (and tiles)
// at the step's end ("fp8_input_scale", "fp8_weight_scale", "fp8_grad_scale").
std::vector<std::string> Fp8MetricsColumns();
void AddFp8Metrics(const amp::Fp8Training& fp8, std::map<std::string, double>& extras);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_FP8_SETUP_H_
