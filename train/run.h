// What every training binary shares: resolving user paths under `bazel run`, the precision and
// loss-scaler choice, the optimizer by name, stop requests from Ctrl-C / SIGTERM, and checkpoints
// (one safetensors file holding the model, the optimizer with its masters and scaler, the data
// order and the generators, so a resumed run continues bit for bit).
//
//   tg::train::StopSignal::Install();
//   auto mp = tg::train::MakeMixedPrecisionOptimizer(model->parameters(), {...});
//   for (...) {
//     ...
//     if (tg::train::StopSignal::requested()) { SaveCheckpoint(...); return 128 + signal; }
//   }
#ifndef TAPEGRAD_TRAIN_RUN_H_
#define TAPEGRAD_TRAIN_RUN_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "amp/mixed_precision_optimizer.h"
#include "amp/training_optimizer.h"
#include "autograd/autocast.h"
#include "autograd/variable.h"
#include "nn/module.h"
#include "optim/lr_schedule.h"
#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/generator.h"
#include "tensor/state_dict.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "train/step_record.h"

namespace tg::train {

// Allocator policy for a training process: glibc returns large freed blocks (activations,
// gradients) to the kernel and page-faults them back in on the next step; this keeps them in the
// process (the mmap threshold raised to glibc's 32 MiB maximum, the trim threshold to 1 GiB), which
// removes most of the system time of a CPU training step. Call once at the start of main().
void KeepFreedMemoryInProcess();

// A path given on the command line, made absolute against the directory where `bazel run` was
// typed (BUILD_WORKING_DIRECTORY), or the current directory outside bazel run.
std::string ResolveUserPath(const std::string& path);

// --device: "cpu", "cuda" (= cuda:0) or "cuda:N". InvalidArgument for another name,
// FailedPrecondition naming the reason when the CUDA device cannot be used (no GPU, no such
// device). The training binaries then build the model on the CPU, move it with Module::to and
// make the optimizer afterwards, so masters and moments live on the device too; batches are
// read on the host and copied per step.
absl::StatusOr<Device> CheckDevice(const std::string& device);

// The same tensors on the CPU (device tensors copied, host ones shared): what checkpoints write.
StateDict ToHost(const StateDict& state);

// Opens the metrics CSV `path` (a user path; empty: leaves *out empty). When resuming, rows after
// `resume_step` are dropped first.
absl::Status OpenMetrics(const std::string& path, std::optional<int64_t> resume_step,
                         const std::vector<std::string>& extra_columns,
                         std::optional<MetricsWriter>* out);

// "f32" | "f16" | "bf16".
absl::StatusOr<DType> ParsePrecision(const std::string& name);

struct OptimizerConfig {
  std::string name = "adamw";  // adamw | adam | sgd
  double lr = 1e-3;
  double weight_decay = 0;
  double momentum = 0.9;  // sgd
  double beta2 = 0.999;   // adam, adamw
  // Weight decay only on parameters with 2 or more dims (matrices, embeddings, conv kernels),
  // none on biases and norm weights: nanoGPT's and llm.c's grouping. Group 0 holds the decayed.
  bool decay_matrices_only = true;
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
  std::function<void(const Tensor& found_inf)> reduce_found_inf;
};

// The optimizer named by `config` over `params` (with decay_matrices_only: group 0 the matrices,
// group 1 the rest, without weight decay). InvalidArgument names an unknown optimizer.
absl::StatusOr<std::unique_ptr<optim::Optimizer>> MakeOptimizer(const std::vector<Variable>& params,
                                                                const OptimizerConfig& config);
// The MixedPrecisionOptions of `precision` (the scaler preset, reduce_found_inf).
// InvalidArgument names an unknown scaler.
absl::StatusOr<amp::MixedPrecisionOptions> MakeMixedPrecisionOptions(
    const PrecisionConfig& precision);

// The optimizer over `params` wrapped in a MixedPrecisionOptimizer (f32 masters for f16/bf16
// parameters; f32 parameters are their own masters), with the scaler preset. InvalidArgument
// names an unknown optimizer or scaler.
absl::StatusOr<std::unique_ptr<amp::MixedPrecisionOptimizer>> MakeMixedPrecisionOptimizer(
    const std::vector<Variable>& params, const OptimizerConfig& optimizer,
    const PrecisionConfig& precision);

// Autocast to `dtype` for the forward pass of a low-precision run; nothing for f32.
class PrecisionScope {
 public:
  explicit PrecisionScope(DType dtype) {
    if (dtype != kF32) guard_.emplace(dtype);
  }

 private:
  std::optional<amp::AutocastGuard> guard_;
};

struct StepStats {
  double loss = 0;  // unscaled
  double lr = 0;    // of parameter group 0, used by this step
  double grad_norm =
      0;  // total norm of the unscaled gradients before clipping (inf/NaN on overflow)
  amp::StepResult result;      // result.scale: the loss scale this step's backward used
  double loss_scale_next = 1;  // the scaler's scale after this step's update
};

// Gradient accumulation: one optimizer step over `micro_batches` forward/backward passes.
struct Accumulation {
  int64_t micro_batches = 1;  // >= 1
  // Data-parallel ranks whose gradients are summed (DDP with ReduceOp::kSum), >= 1: each rank's
  // backward runs on loss / (micro_batches * summed_ranks), the seed that one process on the
  // global batch gives each row, so the backward's per-row values (and their f16 overflows) are
  // that process's. 1 without data parallelism or when the gradients are averaged.
  int64_t summed_ranks = 1;
  // Runs `body` (one micro-batch's forward and backward) with the data-parallel gradient
  // synchronisation off when `sync` is false (DDP's no_sync); null: body() as it is.
  std::function<void(bool sync, const std::function<void()>& body)> sync_scope;
};

// One optimizer step: zero_grad, `loss_fn()` under PrecisionScope(dtype), backward through the
// mixed-precision optimizer, clipping to `max_grad_norm` (> 0; 0 only measures the norm), step,
// and the schedule's step (which does not advance when the optimizer step was skipped).
StepStats TrainStep(amp::TrainingOptimizer& opt, optim::LrSchedule& schedule, DType dtype,
                    double max_grad_norm, const std::function<Variable()>& loss_fn);
// With accumulation: `loss_fn(k)` is the mean loss of micro-batch k (of equal sizes), and the
// backward runs on loss / micro_batches (/ summed_ranks), so the master gradients end as the
// gradient of the mean over all micro-batches (the large batch, within f32 rounding); one clip, one
// step and one scaler update follow. Where the optimizer can defer (can_defer_master_grads: the
// MixedPrecisionOptimizer, ZeRO stage 1), every micro-batch but the last accumulates in the
// model's .grad without synchronisation (sync_scope(false, ...)) and the last one reduces and
// unscales the sum once, as DDP's no_sync; ZeRO stage 2/3 reduce every micro-batch into the
// master gradients. StepStats::loss is the mean of the micro-batch losses.
StepStats TrainStep(amp::TrainingOptimizer& opt, optim::LrSchedule& schedule, DType dtype,
                    double max_grad_norm, const std::function<Variable(int64_t micro)>& loss_fn,
                    const Accumulation& accumulation);

// SIGINT / SIGTERM set a flag (the first signal only; a second one kills the process as usual)
// that the training loop polls between steps, so it can save a checkpoint and exit cleanly.
class StopSignal {
 public:
  static void Install();
  static bool requested();
  static int signal_number();  // 0 while none was received
};

// Why a run stops: the signal, and in a data-parallel run which rank received it (every rank
// stops after the same step; see DataParallel::Agree).
struct StopRequest {
  int signal = 0;        // 0: no stop
  int received_by = -1;  // the rank that received it; -1 in a single process
  int this_rank = 0;
  // "signal 15 (Terminated)", plus " received by rank 1" when data parallel.
  std::string Describe() const;
};

// The generator state as metadata text ("seed:offset", exact for every 64-bit value).
std::string GeneratorStateToString(const Generator::State& state);
absl::StatusOr<Generator::State> GeneratorStateFromString(const std::string& text);

// One checkpoint file: tensors and scalars of `state` (prefixed by the caller: "model.",
// "optim.", "data.", ...) and string metadata (configuration, generator states). Written to a
// temporary file and renamed, creating `dir` if needed. Returns the file's path.
absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, const StateDict& state,
                                           const std::map<std::string, std::string>& metadata);
// Reads "<dir>/checkpoint.safetensors"; NotFound when there is none.
absl::StatusOr<StateDict> LoadCheckpoint(const std::string& dir,
                                         std::map<std::string, std::string>* metadata);
std::string CheckpointPath(const std::string& dir);

// A number as the shortest text that reads back as the same double ("0.001", "1e+300", "nan"),
// whole numbers below 1e15 as integers ("100000").
std::string FormatNumber(double value);

// A numeric flag and its documented valid range: [min, max], or with one bound excluded. NaN is
// outside every range, and infinity outside every range with a finite bound.
struct FlagRange {
  enum class Open { kNone, kMin, kMax };
  const char* name;  // without "--"
  double value;
  double min;
  double max;
  Open open = Open::kNone;
};
// InvalidArgument for the first flag outside its range: "--dropout=-0.1 is outside its valid
// range [0, 1)".
absl::Status CheckFlagRanges(const std::vector<FlagRange>& flags);

// Defaults that depend on other flags. A default never makes a valid command fail: a flag the
// user did not give keeps its old default where that fits the flags given (so no command that
// ran before changes its meaning) and adapts where it does not; an explicit value is still
// checked against its range, naming it. Each binary's --help says the rule.
//
// (train_gpt's --n_embd: 64, or the next multiple of --n_head; --block_size: 64, or the context
// of --init_from's file when shorter; the default --batch_size: see ResolveBatchSizes.)
// train_gpt's --warmup_steps when not given: 100, or steps / 10 when --steps is below 100
// (--steps=50 warms up for 5 steps instead of failing on a warmup longer than the run; nanoGPT's
// warmup_iters is a fixed 2000 that its loop never checks against max_iters).
int64_t DefaultWarmupSteps(int64_t steps);
// train_gpt's --min_lr when not given: 3e-4, or lr / 10 when --lr is below 3e-4 (nanoGPT's
// ratio, min_lr 6e-5 for lr 6e-4), so that it never exceeds the lr.
double DefaultMinLr(double lr);

// The batch of one optimizer step. --batch_size is the GLOBAL batch: the rows of one optimizer
// step, summed over the --grad_accum_steps micro-batches and the --world_size ranks (DeepSpeed's
// train_batch_size; nanoGPT's and transformers' batch_size is the micro-batch, which
// --micro_batch_size gives here). The first output line says which is which.
struct BatchSizes {
  int64_t global = 0;  // rows per optimizer step
  int64_t micro = 0;   // rows per forward/backward pass on one rank
  int64_t grad_accum_steps = 1;
  int64_t world_size = 1;
  // "batch: global 64 sequences per step = micro-batch 16 x 4 accumulation steps x 1 rank"
  std::string Describe(const char* rows) const;
};
// --batch_size and --micro_batch_size (each as given, nullopt when not), with the binary's
// default global batch. Both given: they must agree (global = micro x accumulation x ranks).
// Only --micro_batch_size: global = micro x accumulation x ranks. Only --batch_size: it must
// split into accumulation x ranks equal micro-batches. Neither: the default rounded down to a
// multiple of accumulation x ranks (at least one row per micro-batch). InvalidArgument naming the
// flags and values otherwise.
absl::StatusOr<BatchSizes> ResolveBatchSizes(std::optional<int64_t> batch_size,
                                             std::optional<int64_t> micro_batch_size,
                                             int64_t default_batch_size, int64_t grad_accum_steps,
                                             int64_t world_size);

// The settings that decide a run's trajectory (model shape, data, optimizer and its options,
// schedule, precision and scaler, seed, ...), by flag name, in the order the binary adds them. A
// checkpoint records them as "setting.<name>" metadata; resuming compares them one by one, so a
// checkpoint never continues under settings other than its own without the user saying so:
// - a changed `fixed` setting (one the checkpoint's state depends on: the model's shapes, the
//   optimizer, the scaler preset, the batch size, the seed) is refused;
// - a changed overridable setting (lr, weight decay, dropout, step count, ...) is refused unless
//   --override names it; then the run continues with the new value and the binary prints the
//   changes first.
// Data-parallel ranks compare the same settings at start (DataParallel::CheckSameRun).
class RunSettings {
 public:
  struct Setting {
    std::string name;
    std::string value;
    bool fixed;
  };
  void Add(const std::string& name, const std::string& value, bool fixed);
  void Add(const std::string& name, const char* value, bool fixed) {
    Add(name, std::string(value), fixed);
  }
  void Add(const std::string& name, double value, bool fixed) {
    Add(name, FormatNumber(value), fixed);
  }
  const std::vector<Setting>& items() const { return items_; }
  // "setting.<name>" -> value.
  std::map<std::string, std::string> ToMetadata() const;
  // "name=value ...", for the first output line.
  std::string ToString() const;

  // Parses --override ("lr,weight_decay"; empty: none). InvalidArgument for an unknown name, a
  // fixed setting, or any name when the run does not `resume`.
  absl::StatusOr<std::vector<std::string>> ParseOverrides(const std::string& flag,
                                                          bool resume) const;
  // Compares with a checkpoint's metadata; returns the allowed changes as "lr 0.003 -> 0.001".
  // FailedPrecondition naming the first refused difference (or a setting the checkpoint lacks).
  absl::StatusOr<std::vector<std::string>> CheckResume(
      const std::string& dir, const std::map<std::string, std::string>& metadata,
      const std::vector<std::string>& overrides) const;

 private:
  std::vector<Setting> items_;
};

// What data-parallel ranks compare at start (DataParallel::CheckSameRun): the settings
// ("name=value"), every parameter ("param <name> <dtype> [shape]") and the caller's `extra`
// lines (the data size, ...).
std::vector<std::string> RunFingerprint(const RunSettings& settings, const nn::Module& model,
                                        const std::vector<std::string>& extra);

// After a resume with --override: applies the overridden optimizer settings of `config` ("lr":
// the schedule's base lr of every group; "weight_decay": the decayed groups; "beta2") that the
// checkpoint's optimizer and schedule state replaced. Other settings take effect by themselves.
void ApplyOptimizerOverrides(const OptimizerConfig& config,
                             const std::vector<std::string>& overrides, amp::TrainingOptimizer& opt,
                             optim::LrSchedule& schedule);

// --resume: no (the default: a fresh run), yes (--resume, --resume=true: the checkpoint must
// exist), or auto (resume when <checkpoint_dir>/checkpoint.safetensors exists, else start fresh:
// what an elastic launcher's restarts need, torchrun --max-restarts or tools:launch
// --max_restarts, whose first attempt has no checkpoint yet). Parsed from true/false/1/0/yes/no/
// auto; a bare --resume (and --noresume) keep working through NormalizeResumeArgs.
struct ResumeFlag {
  enum class Mode { kNo, kYes, kAuto };
  Mode mode = Mode::kNo;
};
bool AbslParseFlag(absl::string_view text, ResumeFlag* flag, std::string* error);
std::string AbslUnparseFlag(ResumeFlag flag);
// Before absl::ParseCommandLine: absl takes a flag without a value for bools only, so argv's
// "--resume" / "-resume" become "--resume=true" and "--noresume" / "-noresume" "--resume=false"
// (up to a "--" that ends the flags).
void NormalizeResumeArgs(int argc, char** argv);

// Whether this run resumes. `restart_count` is the elastic launcher's restart of the workers
// (TORCHELASTIC_RESTART_COUNT, set by torchrun and tools:launch; 0 on the first attempt).
// auto needs a checkpoint directory (InvalidArgument). A fresh run (no) on a restart when the
// checkpoint exists is refused (FailedPrecondition naming the file and --resume=auto): it would
// begin at step 0 and overwrite the checkpoint of the attempt that failed. `line` gets what
// --resume=auto decided, for the first output line ("" otherwise).
// The binaries' `restart_count`: TORCHELASTIC_RESTART_COUNT, 0 when unset (InvalidArgument
// naming it when it is not an integer >= 0).
absl::StatusOr<int> ElasticRestartCount();
absl::StatusOr<bool> DecideResume(ResumeFlag flag, const std::string& checkpoint_dir,
                                  int restart_count, std::string* line);

// Before training: creates the checkpoint directory with its parents (as mkdir -p), checks that
// a file can be created in it, and removes the temporaries that interrupted saves of its
// checkpoint left behind. Does nothing for an empty dir.
absl::Status PrepareCheckpointDir(const std::string& dir);

// Divergence: a run stops with an error when its loss becomes NaN/inf, or a step is skipped for
// non-finite gradients, and no dynamic loss scaler can absorb it (f32, bf16, or any constant
// scale: MakeMixedPrecisionOptions turns the overflow check on for them, so such a step changes
// no weight), or when a dynamic scaler has skipped `max_skipped_in_a_row` consecutive steps (0:
// never). The binaries check after every step and before any save, so the last checkpoint is
// never overwritten by the diverged state. Megatron-LM and DeepSpeed stop too; training on NaN
// weights to a successful exit helps nobody.
class DivergenceCheck {
 public:
  DivergenceCheck(bool dynamic_scaler, int64_t max_skipped_in_a_row)
      : dynamic_(dynamic_scaler), max_skipped_(max_skipped_in_a_row) {}
  // The weights were loaded from `file` (--resume, --init_from) after step `step`: a divergence
  // that starts with the next step names the file instead of advising a lower --lr.
  void set_loaded_from(std::string file, int64_t step) {
    loaded_from_ = std::move(file);
    loaded_step_ = step;
  }
  // After each step (the loss agreed across ranks). FailedPrecondition says why the run stopped.
  absl::Status Check(int64_t step, double loss, bool skipped);

 private:
  // What to do about it: lower the lr, or (when the trouble starts at the first step after
  // loading a file) look at that file.
  std::string Advice(int64_t first_bad_step) const;

  bool dynamic_;
  int64_t max_skipped_;
  int64_t skipped_in_a_row_ = 0;
  std::string loaded_from_;
  int64_t loaded_step_ = -1;
};

// The end of a run: FailedPrecondition when more than `max_fraction` (in [0, 1]) of its `steps`
// were skipped for non-finite gradients (`flag` names the flag in the message). A run that
// skipped 31 of 32 steps did not train, whatever its loss says; a healthy f16 run skips a few
// steps while its loss scale settles (tests/tools:reliability_test measures them).
absl::Status CheckSkippedFraction(int64_t steps, int64_t skipped, double max_fraction,
                                  const char* flag = "--max_skipped_fraction");

// The first floating tensor of `state` (in key order) that holds NaN or inf, described as
// "tensor 'optim.master.0' holds nan at element 3 of 12 (2 of its elements are not finite)";
// nullopt when every one is finite. One AnyNonFinite pass per tensor; only a bad tensor is read
// element by element.
std::optional<std::string> FindNonFinite(const StateDict& state);

// What every run checkpoints and counts: the model, the optimizer (masters, moments, scaler), the
// schedule, the step and the skipped steps, under the run's settings (see RunSettings). The
// binary adds its data state.
class RunState {
 public:
  RunState(nn::Module& model, amp::TrainingOptimizer& optimizer, optim::LrSchedule& schedule,
           RunSettings settings, int64_t total_steps)
      : model_(model),
        optimizer_(optimizer),
        schedule_(schedule),
        settings_(std::move(settings)),
        total_steps_(total_steps) {}

  // How a sharded optimizer (ZeRO) changes saving and resuming.
  struct Sharding {
    // The model's whole state_dict (ZeRO stage 3 gathers the parameters); null:
    // model.state_dict().
    std::function<StateDict()> model_state;
    // The optimizer's state_dict (and model_state) are collectives: Save calls them on every
    // rank, also on the ranks that write nothing (an empty dir).
    bool collective = false;
    // The model was loaded from the checkpoint before the optimizer sharded it
    // (LoadModelForResume; ZeRO stage 3): Resume does not load it again.
    bool model_preloaded = false;
  };
  void set_sharding(Sharding sharding) { sharding_ = std::move(sharding); }

  int64_t step() const { return step_; }
  int64_t skipped() const { return skipped_; }
  const RunSettings& settings() const { return settings_; }

  // Counts a finished step and returns its record (the caller fills epoch and throughput).
  StepRecord Advance(const StepStats& stats, double elapsed_seconds);

  // Writes <dir>/checkpoint.safetensors with "model.", "optim.", "schedule." and the counters,
  // plus the caller's `extra` entries and metadata (device tensors are copied to the host, so
  // a checkpoint of a CUDA run resumes on either device). Does nothing when dir is empty.
  // FailedPrecondition, writing nothing, when a weight, master or moment is not finite: the last
  // good checkpoint is never replaced by a diverged state (FindNonFinite, one pass over the host
  // copy).
  absl::Status Save(const std::string& dir, const StateDict& extra,
                    std::map<std::string, std::string> metadata) const;
  // Restores what Save wrote and returns the whole checkpoint (for the caller's entries) with its
  // metadata. First compares the settings (RunSettings::CheckResume with `overrides`; the allowed
  // changes go to *changes) and validates the counters: 'step' an integer in [0, total_steps],
  // 'skipped_steps' one in [0, step], the schedule's updates equal to step - skipped_steps and
  // the loss scaler's iterations equal to step. FailedPrecondition for changed settings,
  // DataLoss naming the key and value of a bad number or content that does not fit the model or
  // optimizer; nothing is half-restored in the model on error. Also before anything is restored:
  // every floating tensor is finite (weights, masters, moments; DataLoss naming the tensor and
  // the file), every optimizer option other than the lr equals this run's (beta1, eps, ...: no
  // setting changes them; weight_decay and beta2 may differ when --override names them), each
  // schedule base lr equals this run's lr (unless --override=lr), and every parameter's
  // optimizer step count equals the optimizer updates, 'step' - 'skipped_steps'.
  absl::StatusOr<StateDict> Resume(const std::string& dir,
                                   const std::vector<std::string>& overrides,
                                   std::map<std::string, std::string>* metadata,
                                   std::vector<std::string>* changes);

  // After a stop request: saves, prints why and where the checkpoint went (or that none was
  // written), ends the progress line and returns the exit code 128 + signal (1 if saving failed).
  // Data parallel, every rank prints its line ("rank 1: stopped by signal 15 (Terminated)
  // received by rank 0 after step 7"): rank 0 through `progress`, the others on stderr.
  int SaveAndStop(const std::string& dir, const StateDict& extra,
                  std::map<std::string, std::string> metadata, ProgressReporter& progress,
                  const StopRequest& stop) const;

 private:
  // Resume's checks of the values it restores (see Resume), before anything is restored.
  absl::Status CheckRestoredValues(const std::string& dir, const StateDict& ckpt, int64_t updates,
                                   const std::vector<std::string>& overrides) const;

  nn::Module& model_;
  amp::TrainingOptimizer& optimizer_;
  Sharding sharding_;
  optim::LrSchedule& schedule_;
  RunSettings settings_;
  int64_t total_steps_;
  int64_t step_ = 0;
  int64_t skipped_ = 0;
};

// For an optimizer that shards the model's parameters (ZeRO stage 3), which must see the
// checkpoint's weights when it is built: compares the settings as RunState::Resume does and
// loads the checkpoint's "model." entries into `model` (DataLoss when they do not fit).
absl::Status LoadModelForResume(const std::string& dir, const RunSettings& settings,
                                const std::vector<std::string>& overrides, nn::Module& model);

// Prints "<name>: <message>" for a failed status and returns exit code 1.
int Fail(const char* name, const absl::Status& status);
// Runs a training binary's body; a tg::Error escaping it becomes Fail(name, ...), and so does a
// std::bad_alloc ("out of memory: a host allocation failed (std::bad_alloc)"): every allocation
// failure, also one in a kernel's parallel region, exits 1 with a message.
int RunMain(const char* name, const std::function<int()>& body);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_RUN_H_
