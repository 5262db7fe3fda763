#!/usr/bin/env bash
# Launching as torchrun, srun and mpirun users do (train_mnist, MLP, on the CPU):
# 1. Elastic restarts: under tools:launch --max_restarts=1 a rank stops (SIGTERM after step 6) or
#    dies (SIGKILL once a checkpoint exists); every rank is restarted with
#    TORCHELASTIC_RESTART_COUNT=1 and --resume=auto resumes from the checkpoint: the run ends
#    exactly where the uninterrupted run ends, and the first lines say what --resume=auto did. A
#    restart without --resume=auto is refused instead of overwriting the checkpoint at step 0.
# 2. The world size comes from the launcher's environment (no --world_size anywhere here),
#    also from mpirun's and srun's variables for ranks started by hand.
# 3. The thread pool: with OMP_NUM_THREADS unset, the first line says the CPUs / ranks on the
#    node, or SLURM_CPUS_PER_TASK.
set -euo pipefail

launch="$1"
train_mnist="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS TORCHELASTIC_RESTART_COUNT

summary() { grep -E "^(\[rank 0\] )?(test accuracy|done:)" "$1" | sed -e 's/^\[rank 0\] //' -e 's/ | [0-9]* img\/s mean//' -e 's/ in [0-9]*s//'; }
args=(--model=mlp --epochs=1 --train_limit=4096 --batch_size=128 --print_every=8
      --checkpoint_every=4)

echo "== reference: 2 ranks, uninterrupted, 32 steps"
"$launch" --nproc=2 -- "$train_mnist" "${args[@]}" --checkpoint_dir="$tmp/ref" >"$tmp/ref.log" 2>&1
summary "$tmp/ref.log" | tee "$tmp/ref.sum"
grep -q "after 32 steps" "$tmp/ref.sum"

# The ranks' command: rank 1 of the first attempt runs `first` (its way to fail), every other rank
# and attempt the plain run. $1: the checkpoint directory; $2: first (stop | kill).
cat >"$tmp/rank.sh" <<'SCRIPT'
#!/bin/sh
dir="$1"; first="$2"; shift 2
if [ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  case "$first" in
    stop) exec "$@" --checkpoint_dir="$dir" --stop_at_step=6 ;;
    kill)
      "$@" --checkpoint_dir="$dir" &
      pid=$!
      while [ ! -e "$dir/checkpoint.safetensors" ] && kill -0 "$pid" 2>/dev/null; do sleep 0.02; done
      kill -9 "$pid"; exit 9 ;;
  esac
fi
exec "$@" --checkpoint_dir="$dir"
SCRIPT
chmod +x "$tmp/rank.sh"

for how in stop kill; do
  echo "== rank 1 fails on the first attempt ($how), --max_restarts=1, --resume=auto"
  "$launch" --nproc=2 --max_restarts=1 --grace_s=5 --timeout_s=60 -- \
    "$tmp/rank.sh" "$tmp/$how" "$how" "$train_mnist" "${args[@]}" --resume=auto \
    >"$tmp/$how.log" 2>&1 || { cat "$tmp/$how.log"; echo "FAIL: $how: the launcher failed"; exit 1; }
  grep -qxF "launch: restarting all ranks (restart 1 of 1)" "$tmp/$how.log" ||
    { cat "$tmp/$how.log"; echo "FAIL: $how: no restart"; exit 1; }
  # Rank 0's first lines of each attempt: the threads, then what --resume=auto decided.
  grep -F "[rank 0] --resume=auto" "$tmp/$how.log" >"$tmp/$how.resume"
  printf '%s\n' "[rank 0] --resume=auto: no checkpoint at $tmp/$how/checkpoint.safetensors, starting fresh" \
    "[rank 0] --resume=auto: resuming from $tmp/$how/checkpoint.safetensors" | diff - "$tmp/$how.resume" ||
    { echo "FAIL: $how: the --resume=auto lines differ (expected < > got)"; exit 1; }
  grep -qE "^\[rank 0\] .*resuming after step [0-9]+" "$tmp/$how.log" ||
    { cat "$tmp/$how.log"; echo "FAIL: $how: the restart did not resume"; exit 1; }
  summary "$tmp/$how.log" | tail -n 2 >"$tmp/$how.sum"  # the last attempt's
  diff "$tmp/ref.sum" "$tmp/$how.sum" || { echo "FAIL: $how: the restarted run ends elsewhere"; exit 1; }
  echo "ok   $how: restarted, resumed after step $(grep -oE "resuming after step [0-9]+" "$tmp/$how.log" | head -1 | grep -oE "[0-9]+$"), same end"
done

echo "== a restart without --resume=auto does not overwrite the checkpoint"
cp "$tmp/stop/checkpoint.safetensors" "$tmp/kept.safetensors"
set +e
TORCHELASTIC_RESTART_COUNT=1 "$train_mnist" "${args[@]}" --checkpoint_dir="$tmp/stop" >"$tmp/norestart.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] || { cat "$tmp/norestart.log"; echo "FAIL: exit $rc, expected 1"; exit 1; }
grep -qxF "train_mnist: restart 1 of an elastic run (TORCHELASTIC_RESTART_COUNT=1) would start at step 0 and overwrite $tmp/stop/checkpoint.safetensors: pass --resume=auto to resume from it when it exists" "$tmp/norestart.log" ||
  { cat "$tmp/norestart.log"; echo "FAIL: message"; exit 1; }
cmp "$tmp/stop/checkpoint.safetensors" "$tmp/kept.safetensors"
echo "ok   refused, checkpoint kept"

cpus=$(nproc)
echo "== ranks started by hand with mpirun's and srun's variables ($cpus CPUs, no --world_size)"
# by_hand NAME VAR=VALUE... -- : rank 0 and 1 with the launcher's variables (RANK_VALUE is
# replaced by the rank), a file rendezvous; rank 0's output in $tmp/NAME.0.log.
by_hand() {
  local name="$1"; shift
  local dir; dir="$(mktemp -d "$tmp/rdzv.XXXXXX")"
  local pids=()
  for r in 1 0; do
    env "${@//RANK_VALUE/$r}" TG_RDZV="file://$dir" "$train_mnist" --model=mlp --epochs=1 \
      --train_limit=512 --batch_size=128 --print_every=8 >"$tmp/$name.$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { cat "$tmp/$name.0.log" "$tmp/$name.1.log"; echo "FAIL: $name"; exit 1; }; done
  summary "$tmp/$name.0.log" | grep -q "after 4 steps" || { cat "$tmp/$name.0.log"; echo "FAIL: $name: no result"; exit 1; }
}
per_rank=$((cpus / 2)); [ "$per_rank" -ge 1 ] || per_rank=1
by_hand mpirun OMPI_COMM_WORLD_RANK=RANK_VALUE OMPI_COMM_WORLD_SIZE=2 \
  OMPI_COMM_WORLD_LOCAL_RANK=RANK_VALUE OMPI_COMM_WORLD_LOCAL_SIZE=2
expected="threads: $per_rank (OMP_NUM_THREADS unset: $cpus CPUs / 2 ranks on this node)"
[ "$(head -n 1 "$tmp/mpirun.0.log")" = "$expected" ] ||
  { echo "FAIL: mpirun: first line '$(head -n 1 "$tmp/mpirun.0.log")', expected '$expected'"; exit 1; }
echo "ok   mpirun: world size 2 from OMPI_COMM_WORLD_SIZE, $expected"
by_hand srun SLURM_PROCID=RANK_VALUE SLURM_NTASKS=2 SLURM_LOCALID=RANK_VALUE \
  SLURM_TASKS_PER_NODE="2(x1)" SLURM_CPUS_PER_TASK=1
expected="threads: 1 (OMP_NUM_THREADS unset: SLURM_CPUS_PER_TASK=1, $cpus CPUs available)"
[ "$(head -n 1 "$tmp/srun.0.log")" = "$expected" ] ||
  { echo "FAIL: srun: first line '$(head -n 1 "$tmp/srun.0.log")', expected '$expected'"; exit 1; }
echo "ok   srun: world size 2 from SLURM_NTASKS, $expected"
# An explicit --world_size only confirms the launcher's, and the error names its variable;
# --rank by hand needs --world_size.
misuse() {  # name expected-line env/args...
  local name="$1" message="$2"; shift 2
  set +e; env "$@" >"$tmp/$name.log" 2>&1; local rc=$?; set -e
  [ "$rc" -eq 1 ] && grep -qxF "$message" "$tmp/$name.log" ||
    { cat "$tmp/$name.log"; echo "FAIL: $name: exit $rc, expected 1 and '$message'"; exit 1; }
  echo "ok   $name: $message"
}
misuse mpirun_mismatch "train_mnist: --world_size=3 but the environment has OMPI_COMM_WORLD_SIZE=2 (leave --world_size out to take the launcher's)" \
  OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 TG_RDZV="file://$tmp" "$train_mnist" --world_size=3
misuse srun_mismatch "train_mnist: --world_size=1 but the environment has SLURM_NTASKS=4 (leave --world_size out to take the launcher's)" \
  SLURM_PROCID=0 SLURM_NTASKS=4 TG_RDZV="file://$tmp" "$train_mnist" --world_size=1
misuse rank_without_world "train_mnist: --rank=1 starts a rank by hand and needs --world_size (the ranks' count)" \
  "$train_mnist" --rank=1 --rdzv="file://$tmp"
# OMP_NUM_THREADS set (as tools:launch and torchrun do): left alone, and said.
OMP_NUM_THREADS=1 "$train_mnist" --model=mlp --epochs=1 --train_limit=256 --batch_size=128 >"$tmp/omp.log" 2>&1
[ "$(head -n 1 "$tmp/omp.log")" = "threads: OMP_NUM_THREADS=1" ] ||
  { echo "FAIL: omp: first line '$(head -n 1 "$tmp/omp.log")'"; exit 1; }
echo "ok   OMP_NUM_THREADS=1 kept"
echo "all passed"
