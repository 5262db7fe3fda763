#include "train/flags.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

ABSL_FLAG(std::string, optimizer, "adamw",
          "adamw | adam | sgd | muon (Muon for the hidden matrices with the --muon_* flags, AdamW "
          "with --lr for the embeddings, the output layer, biases and norms)");
ABSL_FLAG(
    double, muon_lr, 0.02,
    "with --optimizer=muon: the hidden matrices' learning rate, (0, 1e3] (scheduled as --lr)");
ABSL_FLAG(double, muon_momentum, 0.95, "with --optimizer=muon: Muon's momentum, [0, 1)");
ABSL_FLAG(bool, muon_nesterov, true, "with --optimizer=muon: Nesterov momentum");
ABSL_FLAG(int64_t, muon_ns_steps, 5, "with --optimizer=muon: Newton-Schulz iterations, 0..99");
ABSL_FLAG(std::string, muon_adjust_lr, "original",
          "with --optimizer=muon: original (lr sqrt(max(1, rows / cols)), Keller Jordan's) | "
          "match_rms_adamw (0.2 lr sqrt(max(rows, cols)), Moonshot's: the AdamW lr fits) | "
          "spectral_unclamped (lr sqrt(rows / cols))");
ABSL_FLAG(std::string, precision, "f32",
          "f32 | f16 | bf16 | fp8 (bf16 with the Linear layers' GEMMs in FP8: --fp8_recipe)");
ABSL_FLAG(std::string, fp8_recipe, "delayed",
          "with --precision=fp8: delayed (per-tensor scales from an amax history, Transformer "
          "Engine's default) | current (per-tensor scales from each tensor's own amax) | block "
          "(1x128 tiles for activations and gradients, 128x128 blocks for weights, as "
          "DeepSeek-V3)");
ABSL_FLAG(int64_t, fp8_amax_history_len, 1024,
          "with --fp8_recipe=delayed: the amax history's length, 1..65536");
ABSL_FLAG(int64_t, fp8_margin, 0,
          "with --fp8_recipe=delayed: scale = fp8_max / amax / 2^margin, -64..64");
ABSL_FLAG(std::string, loss_scaler, "auto",
          "auto (pytorch for f16, none otherwise) | pytorch | megatron | deepspeed (DeepSpeed's "
          "engine config defaults: 2^16, hysteresis 2) | deepspeed_class (its DynamicLossScaler "
          "class defaults: 2^32, no hysteresis) | deepspeed_legacy (the class with DeepSpeed's "
          "growth timing before v0.17.1) | apex | none");
ABSL_FLAG(std::string, checkpoint_dir, "", "where checkpoint.safetensors is written (empty: none)");
ABSL_FLAG(tg::train::ResumeFlag, resume, tg::train::ResumeFlag{},
          "continue from <checkpoint_dir>/checkpoint.safetensors: true (--resume; it must exist), "
          "auto (if it exists, else start fresh: for torchrun/launch restarts), false");
ABSL_FLAG(int64_t, max_skipped_in_a_row, 100,
          "stop with an error after N >= 0 consecutive steps skipped for non-finite gradients "
          "(0: never)");
ABSL_FLAG(double, max_skipped_fraction, 0.5,
          "exit with an error (after the final line) when more than this fraction, in [0, 1], of "
          "the run's steps were skipped for non-finite gradients (1: never)");
ABSL_FLAG(std::string, metrics, "", "CSV file with one row per step (empty: none)");
ABSL_FLAG(std::string, device, "cpu", "cpu | cuda | cuda:N");
ABSL_FLAG(bool, tf32, false, "CUDA: f32 matmuls and convolutions may use TF32 tensor cores");
ABSL_FLAG(int64_t, world_size, 0,
          "data-parallel ranks, 0..65536 (0: the launcher's WORLD_SIZE, OMPI_COMM_WORLD_SIZE or "
          "SLURM_NTASKS, else 1; tools:launch --nproc=N, torchrun, srun, mpirun start them; an "
          "explicit value must match the launcher's)");
ABSL_FLAG(int64_t, rank, -1,
          "this process's rank when started by hand, -1..65535 (-1: from the launcher)");
ABSL_FLAG(std::string, rdzv, "", "rendezvous file:///dir or redis://host:port (default: TG_RDZV)");
ABSL_FLAG(int64_t, zero_stage, 0,
          "0: data parallel with DDP; 1, 2, 3: ZeRO sharding of the optimizer state (1), also the "
          "gradients (2), also the parameters (3) across the --world_size >= 2 ranks");
ABSL_FLAG(int64_t, grad_accum_steps, 1,
          "micro-batches per optimizer step, 1..1000000 (the global --batch_size splits into "
          "world_size x N micro-batches of --micro_batch_size rows; the step equals one on the "
          "whole batch)");
ABSL_FLAG(int64_t, print_every, 50, "status line period >= 1 when stderr is not a terminal");
ABSL_FLAG(int64_t, stop_at_step, 0,
          "testing: send SIGTERM to this process after step N >= 0 (exercises the Ctrl-C path; "
          "0: never)");

namespace tg::train {
namespace {

std::vector<std::string>& GivenFlags() {
  static std::vector<std::string> given;
  return given;
}

}  // namespace

void ParseCommandLine(int argc, char** argv, const char* usage, const char* main_file) {
  absl::SetProgramUsageMessage(usage);
  const std::string main(main_file);
  absl::FlagsUsageConfig config;
  // A flag's file as absl records it: __FILE__ where ABSL_FLAG is written.
  auto shown = [main](absl::string_view file) {
    return file == main || absl::StartsWith(file, "train/");
  };
  config.contains_helpshort_flags = shown;
  config.contains_help_flags = shown;
  absl::SetFlagsUsageConfig(config);
  NormalizeResumeArgs(argc, argv);
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;  // the rest are positional
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) continue;
    GivenFlags().emplace_back(arg.substr(0, arg.find('=')));
  }
  absl::ParseCommandLine(argc, argv);
}

bool FlagGiven(absl::string_view name) {
  for (const std::string& given : GivenFlags()) {
    if (given == name) return true;
  }
  return false;
}

absl::Status CheckFlagsAndShared(std::vector<FlagRange> own) {
  constexpr double kMaxCount = 1e12;
  auto count = [](const absl::Flag<int64_t>& flag) {
    return static_cast<double>(absl::GetFlag(flag));
  };
  own.insert(own.end(),
             {
                 {"max_skipped_in_a_row", count(FLAGS_max_skipped_in_a_row), 0, kMaxCount},
                 {"max_skipped_fraction", absl::GetFlag(FLAGS_max_skipped_fraction), 0, 1},
                 {"world_size", count(FLAGS_world_size), 0, 65536},
                 {"rank", count(FLAGS_rank), -1, 65535},
                 {"zero_stage", count(FLAGS_zero_stage), 0, 3},
                 {"grad_accum_steps", count(FLAGS_grad_accum_steps), 1, 1e6},
                 {"print_every", count(FLAGS_print_every), 1, kMaxCount},
                 {"stop_at_step", count(FLAGS_stop_at_step), 0, kMaxCount},
                 {"muon_lr", absl::GetFlag(FLAGS_muon_lr), 0, 1e3, FlagRange::Open::kMin},
                 {"muon_momentum", absl::GetFlag(FLAGS_muon_momentum), 0, 1, FlagRange::Open::kMax},
                 {"muon_ns_steps", count(FLAGS_muon_ns_steps), 0, 99},
             });
  return CheckFlagRanges(own);
}

MuonConfig MuonFlags() {
  MuonConfig c;
  c.lr = absl::GetFlag(FLAGS_muon_lr);
  c.momentum = absl::GetFlag(FLAGS_muon_momentum);
  c.nesterov = absl::GetFlag(FLAGS_muon_nesterov);
  c.ns_steps = absl::GetFlag(FLAGS_muon_ns_steps);
  c.adjust_lr = absl::GetFlag(FLAGS_muon_adjust_lr);
  return c;
}

}  // namespace tg::train
