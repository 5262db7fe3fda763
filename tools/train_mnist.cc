// Trains an image classifier (a small CNN, or an MLP) on Fashion-MNIST and reports test
// accuracy: the README's main job. It holds the model, the data and the loop; train::Run
// (train/run.h) does the rest. docs/training.md has the flags, precision and checkpoints,
// docs/distributed.md the data-parallel and ZeRO runs.
//
//   bazel run -c opt //tools:train_mnist                                  # CNN, f32, 4 epochs
//   bazel run -c opt //tools:train_mnist -- --model=mlp --precision=f16   # f16 + dynamic scaling
//   bazel run -c opt //tools:train_mnist -- --checkpoint_dir=ckpt --resume  # after Ctrl-C
//   bazel run -c opt //tools:launch -- --nproc=2 -- bazel-bin/tools/train_mnist --world_size=2
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dataset/loader.h"
#include "dataset/mnist.h"
#include "nn/loss.h"
#include "nn/models/image.h"
#include "optim/lr_schedule.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/flag_values.h"
#include "train/flags.h"
#include "train/fp8_setup.h"
#include "train/run.h"
#include "train/run_main.h"
#include "train/user_path.h"

// This binary's own flags; the ones it shares with train_gpt (--optimizer, --precision, --device,
// --resume, --world_size, ...) are defined once in train/flags.cc (train/flags.h says which).
ABSL_FLAG(std::string, model, "cnn", "cnn | mlp");
ABSL_FLAG(int64_t, epochs, 0,
          "passes over the training set, 0..100000 (0: 4 for the CNN, 10 for the MLP)");
ABSL_FLAG(std::optional<int64_t>, batch_size, std::nullopt,
          "GLOBAL batch: images per optimizer step, summed over the --grad_accum_steps "
          "micro-batches and the --world_size ranks, 1..1000000 (default 128, rounded down to a "
          "multiple of grad_accum_steps x world_size). PyTorch examples' and transformers' "
          "batch_size is the micro-batch: give --micro_batch_size instead");
ABSL_FLAG(std::optional<int64_t>, micro_batch_size, std::nullopt,
          "images per forward/backward pass on one rank, 1..1000000; the global batch is then "
          "micro_batch_size x grad_accum_steps x world_size (default: from --batch_size)");
ABSL_FLAG(double, lr, 1e-3, "peak learning rate, (0, 1e3] (cosine decay to lr/10 over the run)");
ABSL_FLAG(double, weight_decay, 1e-4, "weight decay, [0, 1e3]");
ABSL_FLAG(uint64_t, seed, 0, "seed of the initialisation and the data order");
ABSL_FLAG(int64_t, checkpoint_every, 0,
          "also checkpoint every N >= 0 steps (0: at epoch ends only)");
ABSL_FLAG(std::string, override, "",
          "with --resume: settings that may differ from the checkpoint's, comma-separated (of "
          "epochs, lr, weight_decay); any other difference is refused");
ABSL_FLAG(std::string, data_dir, tg::data::kFashionMnistDir, "directory of the IDX files");
ABSL_FLAG(int64_t, train_limit, 0, "train on the first N >= 0 images only (0: all)");

namespace tg {
namespace {

int Fail(const absl::Status& status) { return train::Fail("train_mnist", status); }

// Every numeric flag against its documented range (the flags' help texts); the batch flags only
// when given (their defaults follow from the other flags).
absl::Status CheckFlags() {
  constexpr double kMaxCount = 1e12;
  std::vector<train::FlagRange> own = {
      {"epochs", static_cast<double>(absl::GetFlag(FLAGS_epochs)), 0, 1e5},
      {"lr", absl::GetFlag(FLAGS_lr), 0, 1e3, train::FlagRange::Open::kMin},
      {"weight_decay", absl::GetFlag(FLAGS_weight_decay), 0, 1e3},
      {"checkpoint_every", static_cast<double>(absl::GetFlag(FLAGS_checkpoint_every)), 0,
       kMaxCount},
      {"train_limit", static_cast<double>(absl::GetFlag(FLAGS_train_limit)), 0, kMaxCount}};
  for (const auto& [name, flag] : {std::pair<const char*, std::optional<int64_t>>{
                                       "batch_size", absl::GetFlag(FLAGS_batch_size)},
                                   {"micro_batch_size", absl::GetFlag(FLAGS_micro_batch_size)}}) {
    if (flag) own.push_back({name, static_cast<double>(*flag), 1, 1e6});
  }
  return train::CheckFlagsAndShared(std::move(own));
}

int Main() {
  if (absl::Status s = CheckFlags(); !s.ok()) return Fail(s);
  train::RunOptions run_options;
  run_options.program = "train_mnist";
  run_options.default_batch_size = 128;
  run_options.batch_size = absl::GetFlag(FLAGS_batch_size);
  run_options.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  run_options.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  run_options.overrides = absl::GetFlag(FLAGS_override);
  absl::StatusOr<std::unique_ptr<train::Run>> run_or = train::Run::Start(run_options);
  if (!run_or.ok()) return Fail(run_or.status());
  train::Run& run = **run_or;
  train::DataParallel& dp = run.dp();
  const Device device = run.device();
  absl::StatusOr<train::Precision> precision_or =
      train::ParsePrecision(absl::GetFlag(FLAGS_precision));
  if (!precision_or.ok()) return Fail(precision_or.status());
  const DType dtype = precision_or->dtype;
  const std::string model_name = absl::GetFlag(FLAGS_model);
  if (model_name != "cnn" && model_name != "mlp") {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("unknown --model=", model_name, " (expected cnn or mlp)")));
  }

  // ---- Data: pixels normalised with the training set's mean and std.
  const std::string data_dir = train::ResolveUserPath(absl::GetFlag(FLAGS_data_dir));
  data::MnistOptions norm;
  norm.mean = data::kFashionMnistMean;
  norm.std = data::kFashionMnistStd;
  absl::StatusOr<data::MnistData> train_set =
      data::LoadMnist(data_dir, data::MnistSplit::kTrain, norm);
  if (!train_set.ok()) return Fail(train_set.status());
  absl::StatusOr<data::MnistData> test_set =
      data::LoadMnist(data_dir, data::MnistSplit::kTest, norm);
  if (!test_set.ok()) return Fail(test_set.status());
  const int64_t limit = absl::GetFlag(FLAGS_train_limit);
  if (limit > 0 && limit < train_set->images.size(0)) {
    train_set->images = train_set->images.narrow(0, 0, limit);
    train_set->labels = train_set->labels.narrow(0, 0, limit);
  }
  data::BatcherOptions batching;
  batching.batch_size = run.batch().global;
  batching.seed = absl::GetFlag(FLAGS_seed) + 1;
  data::ImageBatcher batches(train_set->images, train_set->labels, batching);
  const int64_t per_epoch = batches.batches_per_epoch();

  // ---- Model: built on the CPU, then moved (see train::CheckDevice).
  Generator init_gen(absl::GetFlag(FLAGS_seed));
  nn::Sequential model =
      model_name == "cnn" ? nn::MakeImageCnn(init_gen) : nn::MakeImageMlp(init_gen);
  model->to(dtype);
  model->to(device);
  train::PrepareOptions prepare;
  prepare.precision = *precision_or;
  prepare.optimizer.name = absl::GetFlag(FLAGS_optimizer);
  prepare.optimizer.lr = absl::GetFlag(FLAGS_lr);
  prepare.optimizer.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  // --optimizer=muon: the classifier (the last Linear layer) stays with AdamW, as a model's head.
  for (const Tensor& p : model->parameters()) {
    if (p.dim() == 2) prepare.optimizer.adamw_matrices = {p};
  }
  const int64_t epochs = absl::GetFlag(FLAGS_epochs) > 0 ? absl::GetFlag(FLAGS_epochs)
                                                         : (model_name == "cnn" ? 4 : 10);
  prepare.total_steps = epochs * per_epoch;
  prepare.schedule = [&](optim::Optimizer& opt) {
    return std::make_unique<optim::CosineWithWarmupLr>(opt, /*warmup_steps=*/0, prepare.total_steps,
                                                       /*min_lr=*/prepare.optimizer.lr / 10);
  };

  // The run's settings: what a checkpoint and the other ranks must agree with.
  train::RunSettings& settings = run.settings();
  settings.Add("model", model_name, /*fixed=*/true);
  train::AddPrecisionSettings(*precision_or, settings);
  settings.Add("batch_size", static_cast<double>(batching.batch_size), true);
  settings.Add("train_limit", static_cast<double>(limit), true);
  settings.Add("seed", absl::StrCat(absl::GetFlag(FLAGS_seed)), true);
  settings.Add("epochs", static_cast<double>(epochs), /*fixed=*/false);
  settings.Add("lr", prepare.optimizer.lr, false);
  settings.Add("weight_decay", prepare.optimizer.weight_decay, false);
  prepare.data_fingerprint = {absl::StrCat("train_images=", train_set->images.size(0)),
                              absl::StrCat("test_images=", test_set->images.size(0))};
  // --precision=fp8: every Linear layer's GEMMs in FP8 (the MLP's three, the CNN's classifier).
  prepare.fp8_weights = [&]() -> absl::StatusOr<std::vector<Tensor>> {
    return nn::LinearWeights(*model);
  };
  prepare.resume_data = [&](const StateDict& ckpt, std::map<std::string, std::string>&) {
    return train::RestoreImageBatcher(batches, ckpt, run.step(), run.checkpoint_dir());
  };
  prepare.data_state = [&] {
    StateDict d;
    d.Merge("data.", batches.state_dict());
    return d;
  };
  prepare.metric_columns = {"test_loss", "test_acc"};
  prepare.throughput_unit = "img/s";
  prepare.batch_items = "images";
  prepare.training_line_tail = absl::StrCat(": ", prepare.total_steps, " steps");
  if (absl::Status s = run.Prepare(model.ptr(), std::move(prepare)); !s.ok()) return Fail(s);

  // ---- Training: each rank reads only its rows of the global batch, on the host; each
  // micro-batch is copied (converted) to the device.
  while (run.step() < run.total_steps()) {
    data::ImageBatcher::Batch batch = batches.Next(dp.rank(), dp.world_size());
    train::StepRecord record = run.Step(
        [&](int64_t k) {
          return nn::CrossEntropyLoss(
              dp.Forward(*model, Tensor(dp.Micro(batch.images, k).to(device, dtype))),
              dp.Micro(batch.labels, k).to(device));
        },
        static_cast<int64_t>(batch.indices.size()), /*max_grad_norm=*/0);
    const int64_t step = run.step();
    record.epoch = static_cast<double>(step) / per_epoch;
    const bool epoch_end = step % per_epoch == 0;
    std::map<std::string, double> extras;
    if (run.evaluates_here() && (epoch_end || step == run.total_steps())) {
      const train::ClassifierEval test = train::EvaluateClassifier(
          *model, test_set->images, test_set->labels, run.forward_precision(), device);
      extras = {{"test_loss", test.loss}, {"test_acc", test.accuracy}};
      run.progress().Println(absl::StrFormat(
          "epoch %d: test loss %.4f, test accuracy %.2f%% at %.1f s", step / per_epoch, test.loss,
          100 * test.accuracy, run.progress().ElapsedSeconds()));
    }
    if (std::optional<int> exit = run.EndStep(record, extras, /*save=*/epoch_end)) return *exit;
  }
  run.FinishProgress();
  if (!run.evaluates_here()) return 0;
  const train::ClassifierEval test = train::EvaluateClassifier(
      *model, test_set->images, test_set->labels, run.forward_precision(), device);
  if (!dp.is_main()) return 0;
  std::printf("test accuracy %.2f%% (test loss %.4f) after %lld steps, %lld skipped\n",
              100 * test.accuracy, test.loss, static_cast<long long>(run.step()),
              static_cast<long long>(run.skipped()));
  // A run that skipped most of its steps did not train: no successful exit.
  if (absl::Status s = run.CheckSkipped(); !s.ok()) return Fail(s);
  return 0;
}

}  // namespace
}  // namespace tg

int main(int argc, char** argv) {
  tg::train::ParseCommandLine(
      argc, argv,
      "Trains a CNN or an MLP on Fashion-MNIST and reports test accuracy. Flags:", __FILE__);
  return tg::train::RunMain("train_mnist", tg::Main);
}
