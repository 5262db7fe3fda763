// The run libraries of train/ (flag_values, format_number, optimizer_setup, train_step,
// checkpoint, run_settings, resume_flag, divergence, run_state): --device parsing (CheckDevice),
// --loss_scaler presets, the host copies checkpoints are made of (ToHost), flag ranges, run
// settings and --override, the checkpoint directory check, the divergence stop, and
// RunState::Resume's validation of every counter a checkpoint holds.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "amp/loss_scaler.h"
#include "amp/mixed_precision_optimizer.h"
#include "autograd/ops.h"
#include "nn/layers.h"
#include "optim/lr_schedule.h"
#include "optim/muon.h"
#include "tensor/generator.h"
#include "tensor/io/safetensors.h"
#include "train/checkpoint.h"
#include "train/divergence.h"
#include "train/flag_values.h"
#include "train/format_number.h"
#include "train/optimizer_setup.h"
#include "train/resume_flag.h"
#include "train/run_settings.h"
#include "train/run_state.h"
#include "train/train_step.h"

namespace tg::train {
namespace {

TEST(CheckDeviceTest, ParsesCpuAndCudaAndRejectsOtherNames) {
  absl::StatusOr<Device> cpu = CheckDevice("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_TRUE(cpu->is_cpu());
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "CUDA", "cuda0"}) {
    const absl::StatusOr<Device> d = CheckDevice(bad);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(d.status().message(),
              std::string("--device=") + bad + ": expected cpu, cuda or cuda:N");
  }
  // A device no machine has: the reason comes from the CUDA backend (no GPU, or no such device).
  const absl::StatusOr<Device> missing = CheckDevice("cuda:999");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(missing.status().message().rfind("--device=cuda:999: ", 0), 0u)
      << missing.status().message();
}

TEST(ToHostTest, KeepsScalarsAndHostTensors) {
  Generator gen(0);
  StateDict sd;
  sd.tensors["w"] = RandNormal({2, 3}, gen);
  sd.scalars["step"] = 7;
  const StateDict host = ToHost(sd);
  EXPECT_TRUE(host.tensor("w").shares_storage(sd.tensor("w")));  // already on the host
  EXPECT_EQ(host.scalar("step"), 7);
}

TEST(FormatNumberTest, ShortestRoundTrip) {
  EXPECT_EQ(FormatNumber(0.001), "0.001");
  EXPECT_EQ(FormatNumber(128), "128");
  EXPECT_EQ(FormatNumber(-0.1), "-0.1");
  EXPECT_EQ(FormatNumber(1e300), "1e+300");
  EXPECT_EQ(FormatNumber(NAN), "nan");
  EXPECT_EQ(FormatNumber(-INFINITY), "-inf");
  EXPECT_EQ(FormatNumber(0.1 + 0.2), "0.30000000000000004");
}

TEST(CheckFlagRangesTest, NamesTheFirstFlagOutsideItsRange) {
  using Open = FlagRange::Open;
  EXPECT_TRUE(CheckFlagRanges({{"epochs", 0, 0, 10}, {"dropout", 0.5, 0, 1, Open::kMax}}).ok());
  auto message = [](const FlagRange& f) {
    return std::string(CheckFlagRanges({{"ok", 1, 0, 2}, f}).message());
  };
  EXPECT_EQ(message({"epochs", -1, 0, 1e5}), "--epochs=-1 is outside its valid range [0, 100000]");
  EXPECT_EQ(message({"dropout", -0.1, 0, 1, Open::kMax}),
            "--dropout=-0.1 is outside its valid range [0, 1)");
  EXPECT_EQ(message({"dropout", 1, 0, 1, Open::kMax}),
            "--dropout=1 is outside its valid range [0, 1)");
  EXPECT_EQ(message({"lr", 0, 0, 1e3, Open::kMin}), "--lr=0 is outside its valid range (0, 1000]");
  EXPECT_EQ(message({"grad_clip", NAN, 0, 1e12}),
            "--grad_clip=nan is outside its valid range [0, 1000000000000]");
  EXPECT_EQ(message({"grad_clip", INFINITY, 0, 1e12}),
            "--grad_clip=inf is outside its valid range [0, 1000000000000]");
  EXPECT_EQ(CheckFlagRanges({{"top_k", -1, 0, 65}}).code(), absl::StatusCode::kInvalidArgument);
}

RunSettings ExampleSettings(double lr) {
  RunSettings s;
  s.Add("model", "mlp", /*fixed=*/true);
  s.Add("batch_size", 64.0, true);
  s.Add("lr", lr, /*fixed=*/false);
  s.Add("weight_decay", 0.1, false);
  return s;
}

TEST(RunSettingsTest, MetadataAndText) {
  const RunSettings s = ExampleSettings(0.001);
  EXPECT_EQ(s.ToString(), "model=mlp batch_size=64 lr=0.001 weight_decay=0.1");
  const std::map<std::string, std::string> meta = s.ToMetadata();
  EXPECT_EQ(meta.at("setting.lr"), "0.001");
  EXPECT_EQ(meta.size(), 4u);
  EXPECT_TRUE(s.CheckResume("d", meta, {})->empty());
}

TEST(RunSettingsTest, ChangedSettingIsRefusedUnlessOverridden) {
  const std::map<std::string, std::string> saved = ExampleSettings(0.001).ToMetadata();
  const RunSettings now = ExampleSettings(0.002);
  absl::StatusOr<std::vector<std::string>> refused = now.CheckResume("ckpt", saved, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            "cannot resume from ckpt: the checkpoint was written with lr=0.001, this run has "
            "lr=0.002 (pass --override=lr to continue with the new value)");
  absl::StatusOr<std::vector<std::string>> overrides = now.ParseOverrides("lr", /*resume=*/true);
  ASSERT_TRUE(overrides.ok());
  absl::StatusOr<std::vector<std::string>> allowed = now.CheckResume("ckpt", saved, *overrides);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_EQ(*allowed, std::vector<std::string>{"lr 0.001 -> 0.002"});

  RunSettings other = ExampleSettings(0.001);
  other = RunSettings();
  other.Add("model", "cnn", true);
  EXPECT_EQ(other.CheckResume("ckpt", saved, {}).status().message(),
            "cannot resume from ckpt: the checkpoint was written with model=mlp, this run has "
            "model=cnn (this setting cannot change when resuming)");
  RunSettings more = ExampleSettings(0.001);
  more.Add("dropout", 0.0, false);
  EXPECT_EQ(more.CheckResume("ckpt", saved, {}).status().message(),
            "cannot resume from ckpt: the checkpoint does not record the setting 'dropout' "
            "(written by another program or an older version)");
}

TEST(RunSettingsTest, OverrideNamesOnlyOverridableSettings) {
  const RunSettings s = ExampleSettings(0.001);
  EXPECT_EQ(*s.ParseOverrides("", /*resume=*/false), std::vector<std::string>{});
  EXPECT_EQ(*s.ParseOverrides("lr,weight_decay", true),
            (std::vector<std::string>{"lr", "weight_decay"}));
  EXPECT_EQ(s.ParseOverrides("lr", /*resume=*/false).status().message(),
            "--override=lr applies only with --resume");
  EXPECT_EQ(s.ParseOverrides("lr,momentum", true).status().message(),
            "--override=lr,momentum: there is no setting 'momentum' (settings that can: lr, "
            "weight_decay)");
  EXPECT_EQ(s.ParseOverrides("model", true).status().message(),
            "--override=model: 'model' cannot change when resuming (settings that can: lr, "
            "weight_decay)");
}

TEST(PrepareCheckpointDirTest, CreatesParentsAndRemovesStaleTemporaries) {
  const std::string root = ::testing::TempDir() + "/prepare";
  const std::string dir = root + "/a/b/ckpt";
  ASSERT_TRUE(PrepareCheckpointDir(dir).ok());
  struct stat info;
  ASSERT_EQ(stat(dir.c_str(), &info), 0);
  EXPECT_TRUE(S_ISDIR(info.st_mode));
  EXPECT_TRUE(PrepareCheckpointDir(dir).ok());  // again: nothing to do
  // A temporary of an interrupted save by a process that no longer runs goes; others stay.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  const std::string stale = CheckpointPath(dir) + ".tmp." + std::to_string(child) + ".0";
  const std::string other = dir + "/notes.txt";
  std::ofstream(stale) << "partial";
  std::ofstream(other) << "keep";
  ASSERT_TRUE(PrepareCheckpointDir(dir).ok());
  EXPECT_NE(access(stale.c_str(), F_OK), 0);
  EXPECT_EQ(access(other.c_str(), F_OK), 0);
}

TEST(PrepareCheckpointDirTest, RefusesAPathThroughAFile) {
  const std::string file = ::testing::TempDir() + "/plain_file";
  std::ofstream(file) << "x";
  const absl::Status s = PrepareCheckpointDir(file + "/ckpt");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "--checkpoint_dir=" + file + "/ckpt: cannot create " + file + "/ckpt: Not a directory");
  EXPECT_EQ(PrepareCheckpointDir(file).message(),
            "--checkpoint_dir=" + file + ": exists and is not a directory");
  EXPECT_TRUE(PrepareCheckpointDir("").ok());
}

TEST(DivergenceCheckTest, NonFiniteLossWithoutDynamicScalerStops) {
  DivergenceCheck fixed(/*dynamic_scaler=*/false, /*max_skipped_in_a_row=*/100);
  EXPECT_TRUE(fixed.Check(1, 2.5, false).ok());
  const absl::Status s = fixed.Check(2, NAN, true);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "the run diverged: the loss of step 2 is nan and no dynamic loss scaler can absorb it "
            "(the weights are not updated from a non-finite gradient, but training cannot "
            "recover; lower --lr or use another precision)");
  DivergenceCheck dynamic(/*dynamic_scaler=*/true, /*max_skipped_in_a_row=*/3);
  EXPECT_TRUE(dynamic.Check(1, INFINITY, true).ok());  // the scaler backs off
  EXPECT_TRUE(dynamic.Check(2, INFINITY, true).ok());
  EXPECT_TRUE(dynamic.Check(3, 1.0, false).ok());  // a clean step resets the count
  EXPECT_TRUE(dynamic.Check(4, INFINITY, true).ok());
  EXPECT_TRUE(dynamic.Check(5, INFINITY, true).ok());
  EXPECT_EQ(dynamic.Check(6, INFINITY, true).message(),
            "the run diverged: 3 consecutive steps were skipped (steps 4 to 6 had non-finite "
            "gradients at every loss scale tried; --max_skipped_in_a_row=3)");
  DivergenceCheck never(true, 0);
  for (int i = 1; i < 1000; ++i) EXPECT_TRUE(never.Check(i, NAN, true).ok());
}

// A skipped step (non-finite gradients with a finite loss) of a constant scale stops the run: no
// scale can go down, so every next step would be skipped too.
TEST(DivergenceCheckTest, SkippedStepWithoutDynamicScalerStops) {
  DivergenceCheck fixed(/*dynamic_scaler=*/false, /*max_skipped_in_a_row=*/100);
  EXPECT_TRUE(fixed.Check(1, 2.5, false).ok());
  const absl::Status s = fixed.Check(2, 2.25, true);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "the run diverged: the gradients of step 2 are not finite (its loss is 2.25) and no "
            "dynamic loss scaler can absorb them (the step was skipped, no weight changed, but "
            "training cannot recover; lower --lr or use another precision)");
}

// When the trouble starts at the first step after loading a file, the message names the file
// instead of advising a lower --lr.
TEST(DivergenceCheckTest, ADivergenceRightAfterLoadingNamesTheFile) {
  DivergenceCheck fixed(false, 100);
  fixed.set_loaded_from("/ckpt/checkpoint.safetensors", 7);
  EXPECT_EQ(fixed.Check(8, NAN, true).message(),
            "the run diverged: the loss of step 8 is nan and no dynamic loss scaler can absorb it "
            "(the weights are not updated from a non-finite gradient, but training cannot "
            "recover; it began at the first step after loading /ckpt/checkpoint.safetensors: the "
            "weights or optimizer state of that file do not train (finite, but not a state this "
            "run can continue from))");
  DivergenceCheck later(false, 100);
  later.set_loaded_from("/ckpt/checkpoint.safetensors", 7);
  EXPECT_TRUE(later.Check(8, 1.0, false).ok());
  EXPECT_TRUE(absl::EndsWith(later.Check(9, NAN, true).message(),
                             "; lower --lr or use another precision)"));
  DivergenceCheck dynamic(true, 2);
  dynamic.set_loaded_from("init.safetensors", 0);
  EXPECT_TRUE(dynamic.Check(1, INFINITY, true).ok());
  EXPECT_EQ(dynamic.Check(2, INFINITY, true).message(),
            "the run diverged: 2 consecutive steps were skipped (steps 1 to 2 had non-finite "
            "gradients at every loss scale tried; --max_skipped_in_a_row=2; it began at the first "
            "step after loading init.safetensors: the weights or optimizer state of that file do "
            "not train (finite, but not a state this run can continue from))");
}

TEST(CheckSkippedFractionTest, ExitsPastTheFraction) {
  EXPECT_TRUE(CheckSkippedFraction(32, 8, 0.25).ok());  // exactly the fraction
  EXPECT_TRUE(CheckSkippedFraction(0, 0, 0.25).ok());
  const absl::Status s = CheckSkippedFraction(32, 31, 0.25);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "the run skipped 31 of its 32 steps (96.9%) for non-finite gradients, more than "
            "--max_skipped_fraction=0.25 of them: it did not train (lower --lr, or use bf16 or "
            "f32)");
  EXPECT_FALSE(CheckSkippedFraction(32, 9, 0.25).ok());
  EXPECT_TRUE(CheckSkippedFraction(32, 32, 1).ok());  // 1: never
  EXPECT_FALSE(CheckSkippedFraction(32, 1, 0).ok());
}

TEST(FindNonFiniteTest, NamesTheFirstTensorAndElement) {
  StateDict sd;
  sd.tensors["a"] = RawTensor::FromVector<float>({1, 2}, {2});
  sd.tensors["b"] = RawTensor::FromVector<float>({1, NAN, INFINITY, -INFINITY}, {2, 2});
  sd.tensors["c"] = RawTensor::FromVector<float>({NAN}, {1});
  sd.tensors["i"] = RawTensor::FromVector<int64_t>({1}, {1});
  EXPECT_EQ(FindNonFinite(sd),
            "tensor 'b' holds nan at element 1 of 4 (3 of its elements are not finite)");
  sd.tensors.erase("b");
  EXPECT_EQ(FindNonFinite(sd),
            "tensor 'c' holds nan at element 0 of 1 (1 of its elements is not finite)");
  sd.tensors.erase("c");
  sd.tensors["h"] = RawTensor::FromVector<float>({0, INFINITY}, {2}).to(kF16);
  EXPECT_EQ(FindNonFinite(sd),
            "tensor 'h' holds inf at element 1 of 2 (1 of its elements is not finite)");
  sd.tensors.erase("h");
  EXPECT_EQ(FindNonFinite(sd), std::nullopt);
}

// f32 (and bf16) runs check the gradients too: a step on NaN gradients with a finite loss is
// skipped (no master weight changes) instead of writing NaN into every weight.
TEST(MakeMixedPrecisionOptimizerTest, F32StepsOnNonFiniteGradientsAreSkipped) {
  Generator gen{0};
  auto model = std::make_shared<nn::LinearImpl>(3, 2, gen);
  std::unique_ptr<amp::MixedPrecisionOptimizer> opt =
      *MakeMixedPrecisionOptimizer(model->parameters(), OptimizerConfig{}, PrecisionConfig{});
  optim::CosineWithWarmupLr schedule{opt->optimizer(), 0, 10, 1e-4};
  const std::vector<float> before = model->weight.data().to_vector<float>();
  const RawTensor x = RandNormal({4, 3}, gen);
  // sqrt(0 * y): the loss is 0, its gradient 0 * inf = NaN.
  StepStats stats = TrainStep(*opt, schedule, kF32, 0,
                              [&] { return Sum(Sqrt(MulScalar((*model)(Tensor(x)), 0.0))); });
  EXPECT_EQ(stats.loss, 0);
  EXPECT_TRUE(stats.result.skipped);
  EXPECT_EQ(model->weight.data().to_vector<float>(), before);
}

// --optimizer=muon: group 0 the hidden matrices under Muon, then AdamW over the named matrices
// (decayed) and the vectors (not); --override's lr and muon_lr reach their own groups only.
TEST(MakeOptimizerTest, MuonTakesTheHiddenMatricesAndAdamWTheRest) {
  const Tensor hidden(RawTensor::Zeros({4, 3}), true), embedding(RawTensor::Zeros({5, 4}), true);
  const Tensor bias(RawTensor::Zeros({4}), true);
  OptimizerConfig config;
  config.name = "muon";
  config.lr = 1e-3;
  config.weight_decay = 0.1;
  config.muon.lr = 0.05;
  config.muon.adjust_lr = "match_rms_adamw";
  config.adamw_matrices = {embedding};
  std::unique_ptr<optim::Optimizer> opt = *MakeOptimizer({embedding, hidden, bias}, config);
  std::vector<optim::ParamGroup>& groups = opt->param_groups();
  ASSERT_EQ(groups.size(), 3u);
  const optim::MuonOptions& muon = groups[0].options_as<optim::MuonOptions>();
  EXPECT_TRUE(groups[0].params[0].is_same(hidden));
  EXPECT_EQ(muon.lr(), 0.05);
  EXPECT_EQ(muon.weight_decay(), 0.1);
  EXPECT_EQ(muon.adjust_lr_fn(), optim::MuonAdjustLr::kMatchRmsAdamW);
  EXPECT_TRUE(groups[1].params[0].is_same(embedding));
  EXPECT_EQ(groups[1].options_as<optim::AdamWOptions>().weight_decay(), 0.1);
  EXPECT_TRUE(groups[2].params[0].is_same(bias));
  EXPECT_EQ(groups[2].options_as<optim::AdamWOptions>().weight_decay(), 0);
  EXPECT_EQ(groups[2].lr(), 1e-3);

  amp::MixedPrecisionOptimizer mp(std::move(opt), amp::MixedPrecisionOptions{});
  optim::CosineWithWarmupLr schedule{mp.optimizer(), 0, 10, 0};
  config.lr = 2e-3;
  config.muon.lr = 0.07;
  config.weight_decay = 0.2;
  ApplyOptimizerOverrides(config, {"muon_lr", "weight_decay"}, mp, schedule);
  EXPECT_EQ(schedule.base_lrs(), (std::vector<double>{0.07, 1e-3, 1e-3}));
  const std::vector<optim::ParamGroup>& after = mp.optimizer().param_groups();
  EXPECT_EQ(after[0].options_as<optim::MuonOptions>().weight_decay(), 0.2);
  EXPECT_EQ(after[1].options_as<optim::AdamWOptions>().weight_decay(), 0.2);
  EXPECT_EQ(after[2].options_as<optim::AdamWOptions>().weight_decay(), 0);
  ApplyOptimizerOverrides(config, {"lr"}, mp, schedule);
  EXPECT_EQ(schedule.base_lrs(), (std::vector<double>{0.07, 2e-3, 2e-3}));

  config.adamw_matrices = {hidden, embedding};
  EXPECT_EQ(MakeOptimizer({embedding, hidden, bias}, config).status().message(),
            "--optimizer=muon: the model has no hidden 2-D matrices for Muon (every 2-D "
            "parameter is an embedding or the output head)");
  config.adamw_matrices = {};
  config.muon.adjust_lr = "rms";
  EXPECT_EQ(MakeOptimizer({hidden}, config).status().message(),
            "unknown Muon adjust_lr 'rms' (expected original, match_rms_adamw or "
            "spectral_unclamped)");
}

// --loss_scaler names the presets with their libraries' defaults.
TEST(MakeMixedPrecisionOptimizerTest, LossScalerPresets) {
  Generator gen{0};
  nn::LinearImpl model(3, 2, gen);
  auto made = [&](const std::string& name) {
    PrecisionConfig precision;
    precision.loss_scaler = name;
    return MakeMixedPrecisionOptimizer(model.parameters(), OptimizerConfig{}, precision);
  };
  absl::StatusOr<std::unique_ptr<amp::MixedPrecisionOptimizer>> apex = made("apex");
  ASSERT_TRUE(apex.ok()) << apex.status();
  EXPECT_EQ((*apex)->scaler().scale(), 65536);
  EXPECT_EQ((*apex)->scaler().options().growth_interval, 2000);
  EXPECT_EQ((*apex)->scaler().options().max_scale, 16777216);
  // deepspeed: what DeepSpeed's engine builds from its config defaults (it used to be the
  // class defaults, now deepspeed_class).
  absl::StatusOr<std::unique_ptr<amp::MixedPrecisionOptimizer>> deepspeed = made("deepspeed");
  ASSERT_TRUE(deepspeed.ok()) << deepspeed.status();
  EXPECT_EQ((*deepspeed)->scaler().scale(), 65536);
  EXPECT_EQ((*deepspeed)->scaler().options().hysteresis, 2);
  EXPECT_EQ((*deepspeed)->scaler().options().growth_interval, 1000);
  EXPECT_EQ((*deepspeed)->scaler().options().min_scale, 1);
  EXPECT_TRUE((*deepspeed)->scaler().options().raise_at_min_scale);
  EXPECT_TRUE((*deepspeed)->scaler().options().first_growth_waits_one_more);
  absl::StatusOr<std::unique_ptr<amp::MixedPrecisionOptimizer>> ds_class = made("deepspeed_class");
  ASSERT_TRUE(ds_class.ok()) << ds_class.status();
  EXPECT_EQ((*ds_class)->scaler().scale(), 4294967296.0);
  EXPECT_EQ((*ds_class)->scaler().options().hysteresis, 1);
  EXPECT_TRUE((*ds_class)->scaler().options().first_growth_waits_one_more);
  absl::StatusOr<std::unique_ptr<amp::MixedPrecisionOptimizer>> legacy = made("deepspeed_legacy");
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  EXPECT_EQ((*legacy)->scaler().scale(), 4294967296.0);
  EXPECT_EQ((*legacy)->scaler().options().growth_interval, 1000);
  EXPECT_FALSE((*legacy)->scaler().options().first_growth_waits_one_more);
  EXPECT_EQ(made("apex2").status().message(),
            "unknown loss scaler 'apex2' (expected auto, pytorch, megatron, deepspeed, "
            "deepspeed_class, deepspeed_legacy, apex or none)");
}

// A checkpoint written when --loss_scaler=deepspeed meant the class defaults (no
// "loss_scaler_meaning" metadata) resumes only under deepspeed_class, the same rules; under the
// new deepspeed it is refused naming the flag, never continued under other rules.
TEST(RunSettingsTest, OldDeepSpeedCheckpointMapsToDeepSpeedClass) {
  auto settings = [](const char* scaler) {
    RunSettings s;
    s.Add("loss_scaler", scaler, /*fixed=*/true);
    s.Add("lr", 0.001, false);
    return s;
  };
  std::map<std::string, std::string> old_meta = {{"setting.loss_scaler", "deepspeed"},
                                                 {"setting.lr", "0.001"}};
  EXPECT_EQ(settings("deepspeed").CheckResume("ckpt", old_meta, {}).status().message(),
            "cannot resume from ckpt: the checkpoint was written with loss_scaler=deepspeed when "
            "it meant DeepSpeed's DynamicLossScaler class defaults (init 2^32, no hysteresis); "
            "--loss_scaler=deepspeed now means DeepSpeed's engine config defaults (init 2^16, "
            "hysteresis 2): resume with --loss_scaler=deepspeed_class, the rules the checkpoint "
            "was written with");
  absl::StatusOr<std::vector<std::string>> mapped =
      settings("deepspeed_class").CheckResume("ckpt", old_meta, {});
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_TRUE(mapped->empty());
  EXPECT_EQ(settings("pytorch").CheckResume("ckpt", old_meta, {}).status().message(),
            "cannot resume from ckpt: the checkpoint was written with loss_scaler=deepspeed, this "
            "run has loss_scaler=pytorch (this setting cannot change when resuming)");
  // New checkpoints say which meaning they were written with.
  const std::map<std::string, std::string> new_meta = settings("deepspeed").ToMetadata();
  EXPECT_EQ(new_meta.at("loss_scaler_meaning"), "deepspeed=engine");
  EXPECT_TRUE(settings("deepspeed").CheckResume("ckpt", new_meta, {}).ok());
  EXPECT_EQ(settings("deepspeed_class").CheckResume("ckpt", new_meta, {}).status().message(),
            "cannot resume from ckpt: the checkpoint was written with loss_scaler=deepspeed, this "
            "run has loss_scaler=deepspeed_class (this setting cannot change when resuming)");
}

// Item: a default never makes a valid command fail. The old default where it fits, else one
// that adapts.
TEST(FlagDefaultsTest, WarmupAndMinLrAdaptOnlyWhereTheOldDefaultDoesNotFit) {
  EXPECT_EQ(DefaultWarmupSteps(1500), 100);
  EXPECT_EQ(DefaultWarmupSteps(100), 100);
  EXPECT_EQ(DefaultWarmupSteps(99), 9);
  EXPECT_EQ(DefaultWarmupSteps(50), 5);
  EXPECT_EQ(DefaultWarmupSteps(5), 0);
  EXPECT_EQ(DefaultMinLr(3e-3), 3e-4);
  EXPECT_EQ(DefaultMinLr(3e-4), 3e-4);
  EXPECT_EQ(DefaultMinLr(1e-4), 1e-4 / 10);
}

// --batch_size is the global batch; --micro_batch_size the per-pass one; the description is the
// binaries' first output line.
TEST(FlagDefaultsTest, BatchSizes) {
  auto resolve = [](std::optional<int64_t> global, std::optional<int64_t> micro, int64_t accum,
                    int64_t ranks) { return ResolveBatchSizes(global, micro, 32, accum, ranks); };
  absl::StatusOr<BatchSizes> b = resolve(std::nullopt, 16, 4, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->global, 64);
  EXPECT_EQ(b->Describe("sequences"),
            "batch: global 64 sequences per optimizer step = micro-batch 16 x 4 accumulation "
            "steps x 1 rank");
  b = resolve(64, std::nullopt, 2, 2);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->micro, 16);
  EXPECT_EQ(b->Describe("images"),
            "batch: global 64 images per optimizer step = micro-batch 16 x 2 accumulation steps x "
            "2 ranks");
  b = resolve(std::nullopt, std::nullopt, 1, 1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->Describe("sequences"),
            "batch: global 32 sequences per optimizer step = micro-batch 32 x 1 accumulation step "
            "x 1 rank");
  // The default never fails: rounded down to a multiple of the micro-batch count, at least one.
  b = resolve(std::nullopt, std::nullopt, 3, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->global, 30);
  EXPECT_EQ(b->micro, 10);
  b = resolve(std::nullopt, std::nullopt, 8, 8);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->global, 64);
  EXPECT_EQ(b->micro, 1);
  // Given values are never adjusted.
  EXPECT_EQ(resolve(30, std::nullopt, 4, 1).status().message(),
            "--batch_size=30 (the global batch of an optimizer step) does not split into "
            "--grad_accum_steps=4 x --world_size=1 = 4 equal micro-batches: give a multiple of 4, "
            "or --micro_batch_size=N for N x 4 rows per step");
  EXPECT_EQ(resolve(64, 16, 2, 1).status().message(),
            "--batch_size=64 (the global batch of an optimizer step) is not --micro_batch_size=16 "
            "x --grad_accum_steps=2 x --world_size=1 = 32; give one of the two");
  EXPECT_TRUE(resolve(32, 16, 2, 1).ok());
}

// The metrics row says both scales: the one this step's backward used, and the one after the
// scaler's update (here an overflow: 65536, then 32768 for the next step).
TEST(TrainStepTest, RecordsTheScaleUsedAndTheNextOne) {
  Generator gen{0};
  auto model = std::make_shared<nn::LinearImpl>(3, 2, gen);
  PrecisionConfig precision;
  precision.loss_scaler = "pytorch";
  std::unique_ptr<amp::MixedPrecisionOptimizer> opt =
      *MakeMixedPrecisionOptimizer(model->parameters(), OptimizerConfig{}, precision);
  optim::CosineWithWarmupLr schedule{opt->optimizer(), 0, 10, 1e-4};
  const RawTensor x = RandNormal({4, 3}, gen);
  StepStats stats = TrainStep(*opt, schedule, kF32, 0,
                              [&] { return Sum(Sqrt(MulScalar((*model)(Tensor(x)), 0.0))); });
  EXPECT_TRUE(stats.result.skipped);
  RunState run{*model, *opt, schedule, ExampleSettings(0.001), 10};
  const StepRecord record = run.Advance(stats, 0);
  EXPECT_EQ(record.loss_scale, 65536);
  EXPECT_EQ(record.loss_scale_next, 32768);
}

// With accumulation, the backward runs on loss / (micro_batches * summed_ranks): train/'s
// f16 data parallel divides each rank's loss by the world size and sums the gradients, so that
// the backward sees the per-row values of one process. The reported loss stays the loss.
TEST(TrainStepTest, BackwardOnLossOverMicroBatchesTimesSummedRanks) {
  Tensor w(RawTensor::FromVector(std::vector<float>{1, 2}, {2}), true);
  const Tensor c(RawTensor::FromVector(std::vector<float>{3, 4}, {2}));
  OptimizerConfig sgd;
  sgd.name = "sgd";
  sgd.momentum = 0;
  auto opt = *MakeMixedPrecisionOptimizer({w}, sgd, PrecisionConfig{});
  optim::ConstantLr schedule(opt->optimizer());
  Accumulation accumulation;
  accumulation.micro_batches = 2;
  accumulation.summed_ranks = 4;
  const StepStats stats = TrainStep(
      *opt, schedule, kF32, 0, [&](int64_t) { return Sum(Mul(w, c)); }, accumulation);
  EXPECT_EQ(stats.loss, 11);
  EXPECT_EQ(stats.grad_norm, 1.25);  // |c| / 4: two micro-batches of c / 8
  accumulation.summed_ranks = 0;
  EXPECT_THROW(
      {
        try {
          TrainStep(
              *opt, schedule, kF32, 0, [&](int64_t) { return Sum(Mul(w, c)); }, accumulation);
        } catch (const Error& e) {
          EXPECT_STREQ(e.what(), "TrainStep: summed_ranks must be >= 1, got 0");
          throw;
        }
      },
      Error);
}

// A one-layer model with its optimizer and schedule, checkpointed after `steps` steps.
struct TinyRun {
  Generator gen{0};
  std::shared_ptr<nn::LinearImpl> model = std::make_shared<nn::LinearImpl>(3, 2, gen);
  std::unique_ptr<amp::MixedPrecisionOptimizer> opt =
      *MakeMixedPrecisionOptimizer(model->parameters(), OptimizerConfig{}, PrecisionConfig{});
  optim::CosineWithWarmupLr schedule{opt->optimizer(), 0, 10, 1e-4};
  RunState run{*model, *opt, schedule, ExampleSettings(0.001), /*total_steps=*/10};

  void Train(int steps) {
    RawTensor x = RandNormal({4, 3}, gen);
    for (int i = 0; i < steps; ++i) {
      StepStats stats = TrainStep(*opt, schedule, kF32, 0,
                                  [&] { return Sum((*model)(Tensor(x)) * (*model)(Tensor(x))); });
      run.Advance(stats, 0);
    }
  }
};

class ResumeValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/resume_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_TRUE(PrepareCheckpointDir(dir_).ok());
    TinyRun saved;
    saved.Train(3);
    ASSERT_TRUE(saved.run.Save(dir_, {}, {}).ok());
  }
  // Rewrites the checkpoint with scalar `key` set to `value`, then resumes a fresh run.
  absl::Status ResumeWith(const std::string& key, double value) {
    std::map<std::string, std::string> meta;
    absl::StatusOr<StateDict> sd = io::LoadStateDict(CheckpointPath(dir_), &meta);
    EXPECT_TRUE(sd.ok());
    sd->scalars[key] = value;
    EXPECT_TRUE(io::SaveStateDict(CheckpointPath(dir_), *sd, meta).ok());
    const std::vector<float> before = fresh_.model->weight.data().to_vector<float>();
    std::vector<std::string> changes;
    absl::StatusOr<StateDict> r = fresh_.run.Resume(dir_, {}, &meta, &changes);
    if (!r.ok()) {  // nothing restored
      EXPECT_EQ(fresh_.run.step(), 0);
      EXPECT_EQ(fresh_.model->weight.data().to_vector<float>(), before);
    }
    return r.status();
  }
  // Rewrites the checkpoint with element `index` of tensor `key` set to `value`, then resumes a
  // fresh run.
  absl::Status ResumeWithElement(const std::string& key, int64_t index, float value) {
    std::map<std::string, std::string> meta;
    absl::StatusOr<StateDict> sd = io::LoadStateDict(CheckpointPath(dir_), &meta);
    EXPECT_TRUE(sd.ok());
    std::vector<float> v = sd->tensor(key).to_vector<float>();
    v[index] = value;
    sd->tensors[key] = RawTensor::FromVector<float>(v, sd->tensor(key).shape());
    EXPECT_TRUE(io::SaveStateDict(CheckpointPath(dir_), *sd, meta).ok());
    const std::vector<float> before = fresh_.model->weight.data().to_vector<float>();
    std::vector<std::string> changes;
    absl::StatusOr<StateDict> r = fresh_.run.Resume(dir_, {}, &meta, &changes);
    if (!r.ok()) {
      EXPECT_EQ(fresh_.run.step(), 0);
      EXPECT_EQ(fresh_.model->weight.data().to_vector<float>(), before);
    }
    return r.status();
  }
  std::string dir_;
  TinyRun fresh_;
};

TEST_F(ResumeValidationTest, ValidCheckpointResumes) {
  std::map<std::string, std::string> meta;
  std::vector<std::string> changes;
  ASSERT_TRUE(fresh_.run.Resume(dir_, {}, &meta, &changes).ok());
  EXPECT_EQ(fresh_.run.step(), 3);
  EXPECT_EQ(fresh_.run.skipped(), 0);
}

TEST_F(ResumeValidationTest, BadStepIsRefusedNamingKeyAndValue) {
  const std::string at = "cannot resume from " + dir_ + ": ";
  for (const auto& [value, text] : std::vector<std::pair<double, std::string>>{{NAN, "nan"},
                                                                               {1e300, "1e+300"},
                                                                               {-1, "-1"},
                                                                               {2.5, "2.5"},
                                                                               {11, "11"},
                                                                               {INFINITY, "inf"}}) {
    const absl::Status s = ResumeWith("step", value);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << text;
    EXPECT_EQ(s.message(),
              at + "'step' is " + text + "; expected an integer in [0, 10] (the run's step count)");
  }
}

TEST_F(ResumeValidationTest, BadSkippedStepsIsRefused) {
  const std::string at = "cannot resume from " + dir_ + ": ";
  EXPECT_EQ(ResumeWith("skipped_steps", NAN).message(),
            at + "'skipped_steps' is nan; expected an integer in [0, 3] (at most 'step')");
  EXPECT_EQ(ResumeWith("skipped_steps", 4).message(),
            at + "'skipped_steps' is 4; expected an integer in [0, 3] (at most 'step')");
  // One skipped step more than the schedule and the scaler counted: inconsistent.
  EXPECT_EQ(ResumeWith("skipped_steps", 1).message(),
            at + "'schedule.last_step' is 3 but 'step' - 'skipped_steps' is 2 (the counters of "
                 "the checkpoint disagree)");
}

TEST_F(ResumeValidationTest, CountersMustAgree) {
  const std::string at = "cannot resume from " + dir_ + ": ";
  EXPECT_EQ(ResumeWith("step", 2).message(),
            at + "'schedule.last_step' is 3; expected an integer in [0, 2] (at most 'step')");
  EXPECT_EQ(ResumeWith("step", 4).message(),
            at + "'schedule.last_step' is 3 but 'step' - 'skipped_steps' is 4 (the counters of "
                 "the checkpoint disagree)");
}

TEST_F(ResumeValidationTest, ScalerIterationsMustEqualSteps) {
  EXPECT_EQ(ResumeWith("optim.scaler.iteration", 2).message(),
            "cannot resume from " + dir_ +
                ": 'optim.scaler.iteration' is 2 but 'step' is 3 (the counters of the checkpoint "
                "disagree)");
}

// NaN/inf weights, masters and moments with valid checksums are refused, naming the tensor and
// the file (a NaN master skipped every step, an inf second moment froze a layer).
TEST_F(ResumeValidationTest, NonFiniteTensorsAreRefusedNamingTensorAndFile) {
  const std::string at = "cannot resume from " + dir_ + ": ";
  const std::string why = " in " + CheckpointPath(dir_) +
                          " (a checkpoint's weights, master weights and optimizer moments must "
                          "be finite)";
  absl::Status s = ResumeWithElement("model.weight", 4, NAN);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), at +
                             "tensor 'model.weight' holds nan at element 4 of 6 (1 of its "
                             "elements is not finite)" +
                             why);
  SetUp();
  EXPECT_EQ(ResumeWithElement("optim.optimizer.state.1.exp_avg_sq", 1, INFINITY).message(),
            at +
                "tensor 'optim.optimizer.state.1.exp_avg_sq' holds inf at element 1 of 2 (1 of "
                "its elements is not finite)" +
                why);
}

// Header values that are neither settings nor counters: each must be what this run has.
TEST_F(ResumeValidationTest, OptimizerOptionsMustBeTheRuns) {
  const std::string at = "cannot resume from " + dir_ + ": ";
  EXPECT_EQ(ResumeWith("optim.optimizer.param_groups.0.beta1", 0.8).message(),
            at + "'optim.optimizer.param_groups.0.beta1' is 0.8 but this run's beta1 is 0.9 "
                 "(training never changes it: the checkpoint is corrupt)");
  SetUp();
  EXPECT_EQ(ResumeWith("optim.optimizer.param_groups.1.eps", 0.001).message(),
            at + "'optim.optimizer.param_groups.1.eps' is 0.001 but this run's eps is 1e-08 "
                 "(training never changes it: the checkpoint is corrupt)");
  SetUp();
  EXPECT_EQ(ResumeWith("optim.optimizer.param_groups.0.weight_decay", 0.5).message(),
            at + "'optim.optimizer.param_groups.0.weight_decay' is 0.5 but this run's "
                 "weight_decay is 0 (training never changes it: the checkpoint is corrupt; "
                 "--override=weight_decay changes it on purpose)");
}

TEST_F(ResumeValidationTest, ScheduleBaseLrMustBeTheRunsLr) {
  EXPECT_EQ(ResumeWith("schedule.base_lrs.1", 1).message(),
            "cannot resume from " + dir_ +
                ": 'schedule.base_lrs.1' is 1 but this run's lr is 0.001 (the setting 'lr' "
                "agrees, so the checkpoint is corrupt; --override=lr changes the lr on purpose)");
}

TEST_F(ResumeValidationTest, ParameterStepCountsMustEqualTheUpdates) {
  EXPECT_EQ(ResumeWith("optim.optimizer.state.0.step", 2).message(),
            "cannot resume from " + dir_ +
                ": 'optim.optimizer.state.0.step' is 2 but the run made 3 optimizer updates "
                "('step' - 'skipped_steps'; the counters of the checkpoint disagree)");
}

// The last good checkpoint is never overwritten by a non-finite state.
TEST(RunStateSaveTest, NonFiniteStateIsNotWritten) {
  const std::string dir = ::testing::TempDir() + "/save_non_finite";
  ASSERT_TRUE(PrepareCheckpointDir(dir).ok());
  TinyRun run;
  run.Train(2);
  ASSERT_TRUE(run.run.Save(dir, {}, {}).ok());
  std::ifstream in(CheckpointPath(dir), std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  run.Train(1);
  run.model->bias.data().fill_(NAN);
  const absl::Status s = run.run.Save(dir, {}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "not writing a checkpoint to " + dir +
                             " after step 3: tensor 'model.bias' holds nan at element 0 of 2 (2 "
                             "of its elements are not finite); the run's state is not finite, so "
                             "the last checkpoint is kept");
  std::ifstream again(CheckpointPath(dir), std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>()),
            good);
}

// --resume's values (a bare --resume still means true), and DecideResume: auto resumes when the
// checkpoint exists and says so, a fresh run on an elastic restart over a checkpoint is refused.
TEST(ResumeFlagTest, ParsesTrueFalseAutoAndBareFlags) {
  ResumeFlag f;
  std::string error;
  for (const char* yes : {"true", "1", "yes", "TRUE"}) {
    ASSERT_TRUE(AbslParseFlag(yes, &f, &error)) << yes;
    EXPECT_EQ(f.mode, ResumeFlag::Mode::kYes) << yes;
  }
  ASSERT_TRUE(AbslParseFlag("auto", &f, &error));
  EXPECT_EQ(f.mode, ResumeFlag::Mode::kAuto);
  EXPECT_EQ(AbslUnparseFlag(f), "auto");
  ASSERT_TRUE(AbslParseFlag("false", &f, &error));
  EXPECT_EQ(f.mode, ResumeFlag::Mode::kNo);
  EXPECT_FALSE(AbslParseFlag("sometimes", &f, &error));
  EXPECT_EQ(error,
            "expected true, false or auto (resume when the checkpoint exists, else start fresh)");

  char a0[] = "train", a1[] = "--resume", a2[] = "-noresume", a3[] = "--resume=auto", a4[] = "--",
       a5[] = "--resume";
  char* argv[] = {a0, a1, a2, a3, a4, a5};
  NormalizeResumeArgs(6, argv);
  EXPECT_STREQ(argv[1], "--resume=true");
  EXPECT_STREQ(argv[2], "--resume=false");
  EXPECT_STREQ(argv[3], "--resume=auto");
  EXPECT_STREQ(argv[5], "--resume");  // after "--": not a flag
}

TEST(DecideResumeTest, AutoResumesOnlyWhenTheCheckpointExists) {
  const std::string dir = ::testing::TempDir() + "/decide_resume";
  ASSERT_TRUE(PrepareCheckpointDir(dir).ok());
  unlink(CheckpointPath(dir).c_str());
  ResumeFlag auto_flag, yes, no;
  auto_flag.mode = ResumeFlag::Mode::kAuto;
  yes.mode = ResumeFlag::Mode::kYes;
  std::string line;
  // No checkpoint yet (the first attempt): a fresh start, said.
  absl::StatusOr<bool> r = DecideResume(auto_flag, dir, 0, &line);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(*r);
  EXPECT_EQ(line,
            "--resume=auto: no checkpoint at " + dir + "/checkpoint.safetensors, starting fresh");
  // Without auto: a fresh run, or a resume that must find the checkpoint (RunState::Resume).
  EXPECT_FALSE(*DecideResume(no, dir, 0, &line));
  EXPECT_EQ(line, "");
  EXPECT_TRUE(*DecideResume(yes, dir, 0, &line));
  EXPECT_FALSE(*DecideResume(no, dir, 1, &line));  // a restart with nothing to overwrite

  std::ofstream(CheckpointPath(dir)) << "x";
  r = DecideResume(auto_flag, dir, 1, &line);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(*r);
  EXPECT_EQ(line, "--resume=auto: resuming from " + dir + "/checkpoint.safetensors");
  // A fresh run of the first attempt may overwrite (a new run in an old directory) ...
  EXPECT_FALSE(*DecideResume(no, dir, 0, &line));
  // ... a restart may not: it would replace the failed attempt's progress with step 0's.
  r = DecideResume(no, dir, 2, &line);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            "restart 2 of an elastic run (TORCHELASTIC_RESTART_COUNT=2) would start at step 0 "
            "and overwrite " +
                dir +
                "/checkpoint.safetensors: pass --resume=auto to resume from it when it "
                "exists");
  // auto without a directory: nothing to look for.
  r = DecideResume(auto_flag, "", 0, &line);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "--resume=auto needs --checkpoint_dir (where the checkpoint is looked for)");
}

TEST(ElasticRestartCountTest, FromTorchElasticRestartCount) {
  unsetenv("TORCHELASTIC_RESTART_COUNT");
  EXPECT_EQ(*ElasticRestartCount(), 0);
  setenv("TORCHELASTIC_RESTART_COUNT", "3", 1);
  EXPECT_EQ(*ElasticRestartCount(), 3);
  setenv("TORCHELASTIC_RESTART_COUNT", "x", 1);
  EXPECT_EQ(ElasticRestartCount().status().message(),
            "TORCHELASTIC_RESTART_COUNT='x' is not a restart count (an integer >= 0)");
  unsetenv("TORCHELASTIC_RESTART_COUNT");
}

// --precision: the four names and what they mean; anything else is refused by name.
TEST(ParsePrecisionTest, NamesAndFp8) {
  EXPECT_EQ(ParsePrecision("f32")->dtype, kF32);
  EXPECT_EQ(ParsePrecision("bf16")->dtype, kBF16);
  EXPECT_FALSE(ParsePrecision("bf16")->fp8);
  const absl::StatusOr<Precision> fp8 = ParsePrecision("fp8");
  ASSERT_TRUE(fp8.ok());
  EXPECT_EQ(fp8->dtype, kBF16);  // FP8 GEMMs inside bf16 autocast
  EXPECT_TRUE(fp8->fp8);
  EXPECT_EQ(ParsePrecision("e4m3").status().message(),
            "unknown precision 'e4m3' (expected f32, f16, bf16 or fp8)");
}

// A failed amax reduction at the end of an FP8 forward reaches the caller as a tg::Error from
// PrecisionScope::Finish (the explicit update; no destructor throws), and an exception already
// leaving the scope is not replaced.
TEST(PrecisionScopeTest, AFailedFp8UpdateIsAnErrorNotATermination) {
  Generator gen(5);
  Tensor w(RandNormal({4, 8}, gen), true);
  amp::Fp8Training fp8({w});
  fp8.set_amax_reducer(
      [](std::vector<float>&) { throw Error("all_reduce failed: rank 1 is gone"); });
  const RawTensor x = RandNormal({2, 8}, gen);
  bool thrown = false;
  try {
    {
      PrecisionScope scope(ForwardPrecision(kBF16, &fp8));
      Linear(Tensor(x), w);
      scope.Finish();
    }
  } catch (const Error& e) {
    thrown = std::string(e.what()) == "all_reduce failed: rank 1 is gone";
  }
  EXPECT_TRUE(thrown);
  // An exception from the forward leaves the scope as it is: no update, no second exception.
  thrown = false;
  try {
    PrecisionScope scope(ForwardPrecision(kBF16, &fp8));
    throw Error("forward failed");
  } catch (const Error& e) {
    thrown = std::string(e.what()) == "forward failed";
  }
  EXPECT_TRUE(thrown);
}

}  // namespace
}  // namespace tg::train
