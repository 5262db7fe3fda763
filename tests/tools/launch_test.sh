#!/usr/bin/env bash
# tools:launch on small shell commands: the ranks' environment, "[rank N] " prefixes (stdout to
# stdout, stderr to stderr, a partial last line), the first failure stopping the others (exit
# status, message, well before the others' sleep ends), exit 127 for a missing binary, SIGKILL
# after --grace_s, forwarded signals, and exit 2 for bad flags. Exact output; ranks' lines are
# compared sorted (their order across ranks is not defined).
set -uo pipefail

launch="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0

fail() {
  echo "FAIL $1"
  failures=$((failures + 1))
}

# run NAME ARGS...: runs the launcher, leaving the exit status in $rc, sorted stdout in
# $tmp/NAME.out, sorted stderr in $tmp/NAME.err and the seconds it took in $elapsed.
run() {
  local name="$1"
  shift
  local start=$SECONDS
  "$launch" "$@" >"$tmp/$name.raw_out" 2>"$tmp/$name.raw_err"
  rc=$?
  elapsed=$((SECONDS - start))
  LC_ALL=C sort "$tmp/$name.raw_out" >"$tmp/$name.out"
  LC_ALL=C sort "$tmp/$name.raw_err" >"$tmp/$name.err"
}

# expect NAME STATUS STDOUT STDERR: exact status and (sorted) output of the last run.
expect() {
  local name="$1" status="$2" out="$3" err="$4"
  local ok=1
  if [ "$rc" -ne "$status" ]; then
    fail "$name: exit status $rc, expected $status"
    ok=0
  fi
  if ! diff <(printf '%s' "$out") "$tmp/$name.out" >"$tmp/$name.out.diff"; then
    fail "$name: stdout differs (expected < > got)"
    cat "$tmp/$name.out.diff"
    ok=0
  fi
  if ! diff <(printf '%s' "$err") "$tmp/$name.err" >"$tmp/$name.err.diff"; then
    fail "$name: stderr differs (expected < > got)"
    cat "$tmp/$name.err.diff"
    ok=0
  fi
  if [ "$ok" -eq 1 ]; then echo "ok   $name (${elapsed}s)"; fi
}

# 1. The torchrun-style environment on one node, a fresh file rendezvous removed at the end.
run env --nproc=3 -- /bin/sh -c '
  case "$TG_RDZV" in file:///*) rdzv=file;; *) rdzv="bad:$TG_RDZV";; esac
  [ -d "${TG_RDZV#file://}" ] && rdzv="$rdzv,dir"
  [ "$RANK" = 0 ] && echo "${TG_RDZV#file://}" >"'"$tmp"'/rdzv_dir"
  echo "r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK lw=$LOCAL_WORLD_SIZE rdzv=$rdzv job=${TG_JOB_ID:+set}"
  echo "timeout=${TG_DIST_TIMEOUT_S-unset}"'
expect env 0 "[rank 0] r=0 w=3 l=0 lw=3 rdzv=file,dir job=set
[rank 0] timeout=unset
[rank 1] r=1 w=3 l=1 lw=3 rdzv=file,dir job=set
[rank 1] timeout=unset
[rank 2] r=2 w=3 l=2 lw=3 rdzv=file,dir job=set
[rank 2] timeout=unset
" ""
if [ ! -s "$tmp/rdzv_dir" ]; then
  fail "env: rank 0 did not record its rendezvous directory"
elif [ -e "$(cat "$tmp/rdzv_dir")" ]; then
  fail "env: the rendezvous directory $(cat "$tmp/rdzv_dir") was not removed"
fi

# Each rank's share of the cores for OpenMP/OpenBLAS, unless the user set it.
share=$(( $(nproc) / 2 )); [ "$share" -ge 1 ] || share=1
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS
run threads --nproc=2 -- /bin/sh -c 'echo "omp=$OMP_NUM_THREADS blas=$OPENBLAS_NUM_THREADS"'
expect threads 0 "[rank 0] omp=$share blas=$share
[rank 1] omp=$share blas=$share
" ""
OMP_NUM_THREADS=7 run threads_set --nproc=2 -- /bin/sh -c 'echo "omp=$OMP_NUM_THREADS blas=$OPENBLAS_NUM_THREADS"'
expect threads_set 0 "[rank 0] omp=7 blas=$share
[rank 1] omp=7 blas=$share
" ""

# The second node of two: global ranks, the given rendezvous, job id and timeout.
run node1 --nnodes=2 --node_rank=1 --nproc=2 --rdzv=redis://head:6379 --job_id=run7 \
  --timeout_s=2.5 -- /bin/sh -c 'echo "r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK $TG_RDZV $TG_JOB_ID $TG_DIST_TIMEOUT_S"'
expect node1 0 "[rank 2] r=2 w=4 l=0 redis://head:6379 run7 2.5
[rank 3] r=3 w=4 l=1 redis://head:6379 run7 2.5
" ""

# torchrun's variables with --master_addr/--master_port: no TG_RDZV (not even the launcher's
# own), no TG_JOB_ID unless given.
TG_RDZV=file:///inherited run master --nnodes=2 --node_rank=1 --nproc=2 --master_addr=head \
  --master_port=29400 -- /bin/sh -c 'echo "r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK lw=$LOCAL_WORLD_SIZE g=$GROUP_RANK gw=$GROUP_WORLD_SIZE $MASTER_ADDR:$MASTER_PORT rdzv=${TG_RDZV-unset} job=${TG_JOB_ID-unset}"'
expect master 0 "[rank 2] r=2 w=4 l=0 lw=2 g=1 gw=2 head:29400 rdzv=unset job=unset
[rank 3] r=3 w=4 l=1 lw=2 g=1 gw=2 head:29400 rdzv=unset job=unset
" ""
run master_default --nproc=1 --master_port=29401 -- /bin/sh -c 'echo "$MASTER_ADDR:$MASTER_PORT"'
expect master_default 0 "[rank 0] 127.0.0.1:29401
" ""

# 2. Rank 1 fails: the others (sleeping 60 s) are stopped at once and its status is returned.
run fail --nproc=3 -- /bin/sh -c 'if [ "$RANK" = 1 ]; then echo bye; exit 3; fi; sleep 60'
expect fail 3 "[rank 1] bye
" "launch: rank 1 exited with status 3; stopping the other ranks
"
if [ "$elapsed" -ge 20 ]; then fail "fail: took ${elapsed}s, expected well under 60"; fi

# A rank killed by a signal: 128 + 9.
run killed --nproc=1 -- /bin/sh -c 'kill -9 $$'
expect killed 137 "" "launch: rank 0 was killed by signal 9 (Killed)
"

# Ranks that ignore SIGTERM get SIGKILL after --grace_s (including what they started).
# Rank 0 fails only once rank 1 ignores SIGTERM (it says so through a file).
run grace --nproc=2 --grace_s=1 -- /bin/sh -c '
  if [ "$RANK" = 0 ]; then
    while [ ! -e "'"$tmp"'/grace_ready" ]; do sleep 0.05; done
    exit 4
  fi
  trap "" TERM; touch "'"$tmp"'/grace_ready"; sleep 60 & wait; sleep 60'
expect grace 4 "" "launch: rank 0 exited with status 4; stopping the other ranks
launch: rank 1 still running after 1 s; sending SIGKILL
"
if [ "$elapsed" -ge 20 ]; then fail "grace: took ${elapsed}s"; fi

# --max_restarts: after rank 1 fails on the first attempt, every rank is stopped and all start
# again with TORCHELASTIC_RESTART_COUNT=1 and a fresh job id; the second attempt succeeds.
# Rank 1 fails only once rank 0 has written its first line (it says so through a file), so the
# expected output does not depend on which rank the scheduler runs first.
run restart --nproc=2 --max_restarts=2 --job_id=j -- /bin/sh -c '
  echo "attempt=$TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS job=$TG_JOB_ID"
  if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
    if [ "$RANK" = 0 ]; then touch "'"$tmp"'/restart_rank0_wrote"; sleep 60; exit 0; fi
    while [ ! -e "'"$tmp"'/restart_rank0_wrote" ]; do sleep 0.05; done
    exit 5
  fi
  exit 0'
expect restart 0 "[rank 0] attempt=0 of 2 job=j
[rank 0] attempt=1 of 2 job=j-restart1
[rank 1] attempt=0 of 2 job=j
[rank 1] attempt=1 of 2 job=j-restart1
" "launch: rank 1 exited with status 5; stopping the other ranks
launch: restarting all ranks (restart 1 of 2)
"
if [ "$elapsed" -ge 20 ]; then fail "restart: took ${elapsed}s, expected well under 60"; fi
# Restarts used up: the last attempt's status.
run restart_exhausted --nproc=1 --max_restarts=1 -- /bin/sh -c 'echo "a=$TORCHELASTIC_RESTART_COUNT"; exit 6'
expect restart_exhausted 6 "[rank 0] a=0
[rank 0] a=1
" "launch: rank 0 exited with status 6
launch: rank 0 exited with status 6
launch: restarting all ranks (restart 1 of 1)
"
# Without --max_restarts: one attempt, TORCHELASTIC_RESTART_COUNT=0.
run no_restart --nproc=1 -- /bin/sh -c 'echo "a=$TORCHELASTIC_RESTART_COUNT m=$TORCHELASTIC_MAX_RESTARTS"; exit 6'
expect no_restart 6 "[rank 0] a=0 m=0
" "launch: rank 0 exited with status 6
"

# 3. A binary that does not exist (a path, and a name looked up on PATH): 127 and the reason.
run missing --nproc=1 -- /nonexistent/tg_launch_test_binary --flag
expect missing 127 "" "[rank 0] launch: cannot run '/nonexistent/tg_launch_test_binary': No such file or directory
launch: rank 0 exited with status 127
"
run missing_path --nproc=1 -- tg_launch_test_no_such_command
expect missing_path 127 "" "[rank 0] launch: cannot run 'tg_launch_test_no_such_command': No such file or directory
launch: rank 0 exited with status 127
"

# 4. Bad flags: exit 2 and a message naming the flag.
bad() {  # name expected-first-line args...
  local name="$1" message="$2"
  shift 2
  run "$name" "$@"
  if [ "$rc" -ne 2 ]; then
    fail "$name: exit status $rc, expected 2"
  elif [ "$(head -n 1 "$tmp/$name.raw_err")" != "$message" ]; then
    fail "$name: first stderr line '$(head -n 1 "$tmp/$name.raw_err")', expected '$message'"
  elif [ -s "$tmp/$name.raw_out" ]; then
    fail "$name: wrote to stdout"
  else
    echo "ok   $name"
  fi
}
bad no_binary "launch: no binary to run: put it and its arguments after '--'" --nproc=2
bad no_binary2 "launch: no binary to run: put it and its arguments after '--'" --nproc=2 --
bad nproc0 "launch: --nproc must be >= 1, got 0" --nproc=0 -- true
bad nproc_missing "launch: --nproc must be >= 1, got 0" -- true
bad nproc_text "launch: --nproc='two': Illegal value 'two' specified for flag 'nproc'" \
  --nproc=two -- true
bad node_rank "launch: --node_rank must be in [0, 2) for --nnodes=2, got 2" \
  --nproc=1 --nnodes=2 --node_rank=2 --rdzv=redis://h:1 --job_id=j -- true
bad rdzv_needed \
  "launch: --master_addr (and --master_port) or --rdzv is required with --nnodes=2 (redis://host:port, or file:///dir on a shared filesystem)" \
  --nproc=1 --nnodes=2 -- true
bad two_rdzv "launch: --rdzv and --master_addr/--master_port are two rendezvous; pass one" \
  --nproc=1 --master_addr=h --rdzv=redis://h:1 -- true
bad master_port "launch: --master_port must be in [1, 65535], got 70000" \
  --nproc=1 --master_addr=h --master_port=70000 -- true
bad master_addr_needed "launch: --master_addr is required with --master_port and --nnodes=2 (the host of node 0)" \
  --nproc=1 --nnodes=2 --master_port=5 -- true
bad job_id_needed "launch: --job_id is required with --nnodes=2 (every node must pass the same id)" \
  --nproc=1 --nnodes=2 --rdzv=redis://h:1 -- true
bad rdzv_form "launch: --rdzv must be file:///absolute/dir or redis://host:port, got 'file://rel'" \
  --nproc=1 --rdzv=file://rel -- true
bad unknown "launch: unknown flag --nprocs" --nprocs=2 -- true
bad max_restarts "launch: --max_restarts must be >= 0, got -1" --nproc=1 --max_restarts=-1 -- true
bad max_restarts_nodes "launch: --max_restarts restarts one node's ranks; with --nnodes=2 use torchrun (whose agents restart every node together)" \
  --nproc=1 --nnodes=2 --rdzv=redis://h:1 --job_id=j --max_restarts=1 -- true
bad positional "launch: unexpected argument 'true' before '--' (the binary and its arguments come after '--')" \
  --nproc=2 true

# 5. A last line without a newline is still printed, with the prefix.
run partial --nproc=1 -- /bin/sh -c "printf 'one\ntwo'"
expect partial 0 "[rank 0] one
[rank 0] two
" ""

# 6. stderr lines go to stderr, stdout lines to stdout, each with the prefix.
run streams --nproc=2 -- /bin/sh -c 'echo "out $RANK"; echo "err $RANK" >&2; printf "tail $RANK" >&2'
expect streams 0 "[rank 0] out 0
[rank 1] out 1
" "[rank 0] err 0
[rank 0] tail 0
[rank 1] err 1
[rank 1] tail 1
"

# SIGTERM to the launcher is forwarded to the ranks; it exits with 128 + 15.
start=$SECONDS
"$launch" --nproc=2 -- /bin/sh -c 'trap "echo stopped \$RANK; exit 0" TERM; echo up; sleep 60 & wait' \
  >"$tmp/forward.raw_out" 2>"$tmp/forward.raw_err" &
pid=$!
for _ in $(seq 100); do  # until both ranks are up (at most 10 s)
  [ "$(grep -c up "$tmp/forward.raw_out")" -ge 2 ] && break
  sleep 0.1
done
kill -TERM "$pid"
wait "$pid"
rc=$?
elapsed=$((SECONDS - start))
LC_ALL=C sort "$tmp/forward.raw_out" >"$tmp/forward.out"
LC_ALL=C sort "$tmp/forward.raw_err" >"$tmp/forward.err"
expect forward 143 "[rank 0] stopped 0
[rank 0] up
[rank 1] stopped 1
[rank 1] up
" "launch: got signal 15 (Terminated); forwarding it to the ranks
"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all passed"
