#include "train/flags.h"

#include <optional>

#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/string_view.h"

ABSL_FLAG(std::string, optimizer, "adamw", "adamw | adam | sgd");
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

void ShowSharedFlagsInHelp(const char* main_file) {
  const std::string main(main_file);
  absl::FlagsUsageConfig config;
  // A flag's file as absl records it: __FILE__ where ABSL_FLAG is written.
  auto shown = [main](absl::string_view file) { return file == main || file == __FILE__; };
  config.contains_helpshort_flags = shown;
  config.contains_help_flags = shown;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace tg::train
