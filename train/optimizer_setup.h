// The training optimizer from the flags: the optimizer by name with nanoGPT's weight-decay groups,
// the loss-scaler preset of the precision, the MixedPrecisionOptimizer around them, and the
// optimizer settings that --override changes on resume.
#ifndef TAPEGRAD_TRAIN_OPTIMIZER_SETUP_H_
#define TAPEGRAD_TRAIN_OPTIMIZER_SETUP_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "amp/mixed_precision_optimizer.h"
#include "amp/training_optimizer.h"
#include "autograd/variable.h"
#include "optim/lr_schedule.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace tg::train {

// --optimizer=muon's Muon half (the --muon_* flags).
struct MuonConfig {
  double lr = 0.02;
  double momentum = 0.95;
  bool nesterov = true;
  int64_t ns_steps = 5;
  std::string adjust_lr = "original";  // original | match_rms_adamw | spectral_unclamped
};

struct OptimizerConfig {
  std::string name = "adamw";  // adamw | adam | sgd | muon
  double lr = 1e-3;            // muon: AdamW's
  double weight_decay = 0;     // muon: Muon's and AdamW's decayed group's
  double momentum = 0.9;       // sgd
  double beta2 = 0.999;        // adam, adamw, muon's AdamW
  // Weight decay only on parameters with 2 or more dims (matrices, embeddings, conv kernels),
  // none on biases and norm weights: nanoGPT's and llm.c's grouping. Group 0 holds the decayed.
  bool decay_matrices_only = true;
  MuonConfig muon;
  // muon: the 2-D parameters that are not hidden layers' matrices (embeddings, the output
  // head), which stay with AdamW as in every Muon recipe; the binary names them.
  std::vector<Tensor> adamw_matrices;
};

struct PrecisionConfig {
  DType dtype = kF32;
  // "auto" (pytorch for f16, none otherwise) | "pytorch" | "megatron" | "deepspeed" (DeepSpeed's
  // engine config defaults: LossScaler::DeepSpeedEngine) | "deepspeed_class" (its
  // DynamicLossScaler class defaults, 2^32 without hysteresis: what "deepspeed" meant before) |
  // "deepspeed_legacy" (the class defaults with DeepSpeed's growth timing before v0.17.1) |
  // "apex" (NVIDIA Apex amp) | "none"; each with its library's default settings.
  std::string loss_scaler = "auto";
  // Data-parallel runs: makes found_inf the max over the ranks (DataParallel::ReduceFoundInf).
  std::function<void(const RawTensor& found_inf)> reduce_found_inf = nullptr;
};

// The optimizer named by `config` over `params` (with decay_matrices_only: group 0 the matrices,
// group 1 the rest, without weight decay). "muon": an optim::MuonWithAdamW of group 0 the hidden
// matrices (the 2-D parameters not in config.adamw_matrices) under Muon (config.muon, the
// weight decay), then AdamW (lr, beta2) over adamw_matrices with the weight decay and over the
// rest without (with decay_matrices_only; else one AdamW group of the rest, decayed); the
// Newton-Schulz iteration in bf16, torch's. InvalidArgument names an unknown optimizer or
// adjust_lr, or a muon run without hidden matrices.
absl::StatusOr<std::unique_ptr<optim::Optimizer>> MakeOptimizer(const std::vector<Tensor>& params,
                                                                const OptimizerConfig& config);
// The MixedPrecisionOptions of `precision` (the scaler preset, reduce_found_inf).
// InvalidArgument names an unknown scaler.
absl::StatusOr<amp::MixedPrecisionOptions> MakeMixedPrecisionOptions(
    const PrecisionConfig& precision);

// The optimizer over `params` wrapped in a MixedPrecisionOptimizer (f32 masters for f16/bf16
// parameters; f32 parameters are their own masters), with the scaler preset. InvalidArgument
// names an unknown optimizer or scaler.
absl::StatusOr<std::unique_ptr<amp::MixedPrecisionOptimizer>> MakeMixedPrecisionOptimizer(
    const std::vector<Tensor>& params, const OptimizerConfig& optimizer,
    const PrecisionConfig& precision);

// After a resume with --override: applies the overridden optimizer settings of `config` ("lr":
// the schedule's base lr of every group, Muon's excepted; "muon_lr": that of the Muon groups;
// "weight_decay": the decayed groups; "beta2") that the checkpoint's optimizer and schedule
// state replaced. Other settings take effect by themselves.
void ApplyOptimizerOverrides(const OptimizerConfig& config,
                             const std::vector<std::string>& overrides, amp::TrainingOptimizer& opt,
                             optim::LrSchedule& schedule);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_OPTIMIZER_SETUP_H_
