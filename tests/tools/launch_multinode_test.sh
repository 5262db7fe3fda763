#!/usr/bin/env bash
# Two "nodes" x 2 ranks on loopback through the TCP store hosted by global rank 0: two
# tools:launch invocations with --nnodes=2 --node_rank=0/1 --master_addr/--master_port; then the
# same ranks started by hand with the variables exactly as torchrun sets them, and as srun sets
# them (MASTER_ADDR/MASTER_PORT exported by the batch script). Each rank checks an all_reduce.
# GLOO_SOCKET_IFNAME=lo keeps Gloo on loopback (several nodes would otherwise use the host name).
# A port taken between picking and binding is retried.
set -uo pipefail

launch="$1"
rank_bin="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export GLOO_SOCKET_IFNAME=lo TG_DIST_TIMEOUT_S=60
unset TG_RDZV TG_JOB_ID RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
failures=0

fail() {
  echo "FAIL $1"
  failures=$((failures + 1))
}

# check NAME: the sorted stdout of the last run, and no "Address already in use".
expected="rank 0 of 4 (local 0): all_reduce ok
rank 1 of 4 (local 1): all_reduce ok
rank 2 of 4 (local 0): all_reduce ok
rank 3 of 4 (local 1): all_reduce ok"

# attempt NAME FUNCTION: runs FUNCTION PORT (up to 3 ports) until it does not hit a taken port.
attempt() {
  local name="$1" fn="$2" port
  for _ in 1 2 3; do
    port=$("$rank_bin" --free_port)
    "$fn" "$port" >"$tmp/$name.out" 2>"$tmp/$name.err"
    rc=$?
    grep -q "Address already in use" "$tmp/$name.err" || break
  done
  got=$(sed 's/^\[rank [0-9]*\] //' "$tmp/$name.out" | LC_ALL=C sort)
  if [ "$rc" -ne 0 ] || [ "$got" != "$expected" ]; then
    fail "$name: status $rc; stdout:"
    cat "$tmp/$name.out"
    echo "stderr:"
    cat "$tmp/$name.err"
  else
    echo "ok   $name"
  fi
}

two_launchers() {
  local port="$1"
  "$launch" --nnodes=2 --node_rank=1 --nproc=2 --master_addr=127.0.0.1 --master_port="$port" \
    -- "$rank_bin" &
  local node1=$!
  "$launch" --nnodes=2 --node_rank=0 --nproc=2 --master_addr=127.0.0.1 --master_port="$port" \
    -- "$rank_bin"
  local rc0=$?
  wait "$node1"
  local rc1=$?
  return $((rc0 | rc1))
}

# torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d gives each worker these (no
# TG_* variable at all); rank 0's process hosts the store.
torchrun_env() {
  local port="$1" pids=() rc=0
  for rank in 3 2 1 0; do  # rank 0 last: clients start before the server
    env RANK=$rank LOCAL_RANK=$((rank % 2)) GROUP_RANK=$((rank / 2)) ROLE_RANK=$rank \
      ROLE_NAME=default LOCAL_WORLD_SIZE=2 WORLD_SIZE=4 GROUP_WORLD_SIZE=2 ROLE_WORLD_SIZE=4 \
      MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" TORCHELASTIC_RESTART_COUNT=0 \
      TORCHELASTIC_MAX_RESTARTS=0 TORCHELASTIC_RUN_ID=none TORCHELASTIC_USE_AGENT_STORE=False \
      TORCH_NCCL_ASYNC_ERROR_HANDLING=1 OMP_NUM_THREADS=1 "$rank_bin" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  return $rc
}

# srun --nodes=2 --ntasks-per-node=2 gives each task these; the batch script exports
# MASTER_ADDR (the first host of the allocation) and MASTER_PORT.
srun_env() {
  local port="$1" pids=() rc=0
  for rank in 0 1 2 3; do
    env SLURM_PROCID=$rank SLURM_LOCALID=$((rank % 2)) SLURM_NODEID=$((rank / 2)) \
      SLURM_NTASKS=4 SLURM_NPROCS=4 SLURM_NNODES=2 SLURM_STEP_NUM_NODES=2 \
      SLURM_NTASKS_PER_NODE=2 SLURM_JOB_ID=77 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
      "$rank_bin" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  return $rc
}

attempt launch_two_nodes two_launchers
attempt torchrun_env torchrun_env
attempt srun_env srun_env

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all passed"
