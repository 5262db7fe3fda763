#!/usr/bin/env bash
# Acceptance of --zero_stage and --grad_accum_steps in train_mnist and train_gpt (Gloo on
# loopback):
# - ZeRO stages 1, 2 and 3 on 2 ranks end where the single-process run ends (the printed summary,
#   numbers within 2 units of the 4th decimal as in data_parallel_test);
# - --grad_accum_steps=N (N micro-batches of B/N) ends where one batch of B ends, in one process,
#   on 2 ranks with DDP (no_sync on all but the last micro-batch) and on 2 ranks with ZeRO;
# - a checkpoint written by ZeRO stage 3 on 2 ranks resumes in one process (stage 0) and at stage
#   1 on 2 ranks, and every step after the resume logs the loss, lr, grad norm and loss scale of
#   the uninterrupted single-process run (within f32 rounding: the ranks sum their gradients in
#   another order);
# - FP8 training (delayed scaling, whose amaxes are all-reduced MAX across the ranks) with ZeRO
#   stages 1, 2 and 3 on 2 ranks ends where FP8 with DDP on 2 ranks ends;
# - --zero_stage outside 0..3, and a stage > 0 in one process, are refused with clear messages.
set -euo pipefail
source tests/skip.sh  # relative to the runfiles root, where Bazel runs the test

launch="$1"
train_mnist="$2"
train_gpt="$3"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"

same_within_rounding() {
  paste -d'\n' "$1" "$2" | awk 'NR % 2 == 1 { a = $0; next }
    { n = split(a, x, /[ ,%()]+/); m = split($0, y, /[ ,%()]+/);
      if (n != m) { print "differ: " a " | " $0; bad = 1; next }
      for (i = 1; i <= n; i++) {
        if (x[i] == y[i]) continue;
        if (x[i] ~ /^-?[0-9.]+$/ && y[i] ~ /^-?[0-9.]+$/ && (x[i] - y[i])^2 <= 4.01e-8) continue;
        print "differ: " a " | " $0; bad = 1; break } }
    END { exit bad }' || return 1
  [ "$(wc -l <"$1")" -eq "$(wc -l <"$2")" ] || { echo "different line counts"; return 1; }
}

# Sorted: rank 0's stdout (val loss) and stderr (done:) reach the launcher through two pipes, so
# their order in the log is not the order they were written in; every line has its own prefix.
summary() { grep -E "^(\[rank 0\] )?(test accuracy|val loss|done:)" "$1" | sed -e 's/^\[rank 0\] //' -e 's/ | [0-9]* img\/s mean//' -e 's/ | [0-9]* tok\/s mean//' -e 's/ in [0-9]*s//' | LC_ALL=C sort; }

# run NAME NPROC ARGS...: one process (NPROC 1) or NPROC ranks under the launcher; the summary in
# $tmp/NAME.sum.
run() {
  local name="$1" nproc="$2"
  shift 2
  if [ "$nproc" -eq 1 ]; then
    "$@" >"$tmp/$name.log" 2>&1 || { echo "FAIL $name"; cat "$tmp/$name.log"; exit 1; }
  else
    "$launch" --nproc="$nproc" -- "$@" --world_size="$nproc" >"$tmp/$name.log" 2>&1 ||
      { echo "FAIL $name"; cat "$tmp/$name.log"; exit 1; }
  fi
  summary "$tmp/$name.log" >"$tmp/$name.sum"
}

if [ -d /usr/share/datasets/fashion-mnist ]; then
  echo "== train_mnist: ZeRO stages 1-3 on 2 ranks vs 1 process (MLP, 8 steps of 128 images)"
  mnist=("$train_mnist" --model=mlp --epochs=1 --train_limit=1024 --batch_size=128 --print_every=8)
  run m1 1 "${mnist[@]}"
  cat "$tmp/m1.sum"
  for stage in 1 2 3; do
    run "m2_zero$stage" 2 "${mnist[@]}" --zero_stage="$stage"
    same_within_rounding "$tmp/m1.sum" "$tmp/m2_zero$stage.sum"
    echo "ok   stage $stage"
  done
  echo "== train_mnist: --grad_accum_steps"
  run m1_accum4 1 "${mnist[@]}" --grad_accum_steps=4
  same_within_rounding "$tmp/m1.sum" "$tmp/m1_accum4.sum"
  echo "ok   1 process, 4 micro-batches of 32 = 1 batch of 128"
  run m2_accum2 2 "${mnist[@]}" --grad_accum_steps=2
  same_within_rounding "$tmp/m1.sum" "$tmp/m2_accum2.sum"
  echo "ok   2 ranks (DDP, no_sync), 2 micro-batches of 32 each"
  run m2_zero2_accum2 2 "${mnist[@]}" --grad_accum_steps=2 --zero_stage=2
  same_within_rounding "$tmp/m1.sum" "$tmp/m2_zero2_accum2.sum"
  echo "ok   2 ranks (ZeRO stage 2), 2 micro-batches of 32 each"
else
  # The train_gpt part still runs; the target counts as skipped, not passed (tests/skip.sh).
  skip_part "train_mnist cases: /usr/share/datasets/fashion-mnist is missing (tools/setup.sh installs it)"
fi

echo "== train_gpt: --grad_accum_steps and ZeRO stage 2 (tiny GPT, 8 steps of 8 x 16 characters)"
text="$tmp/text.txt"
for i in $(seq 1 300); do echo "the quick brown fox $i jumps over the lazy dog; all good men $((i * 7))"; done >"$text"
gpt=("$train_gpt" --data="$text" --steps=12 --warmup_steps=2 --batch_size=8 --block_size=16
     --n_layer=1 --n_embd=32 --eval_every=0 --eval_batches=4 --sample_tokens=0 --print_every=6
     --checkpoint_every=0)
run g1 1 "${gpt[@]}"
cat "$tmp/g1.sum"
run g1_accum2 1 "${gpt[@]}" --grad_accum_steps=2
same_within_rounding "$tmp/g1.sum" "$tmp/g1_accum2.sum"
echo "ok   1 process, 2 micro-batches"
run g2_zero2_accum2 2 "${gpt[@]}" --zero_stage=2 --grad_accum_steps=2
same_within_rounding "$tmp/g1.sum" "$tmp/g2_zero2_accum2.sum"
echo "ok   2 ranks, ZeRO stage 2, 2 micro-batches"

echo "== train_gpt: FP8 (delayed) on 2 ranks, ZeRO stages 1-3 vs DDP"
# Every stage casts the same halves of the batch with the same (all-reduced) scales. (One process
# is not the reference: its output gradients are half a rank's, and the first step casts them
# with scale 1, where E5M2's subnormals round g and 2g differently.)
run g2_fp8_zero0 2 "${gpt[@]}" --precision=fp8
cat "$tmp/g2_fp8_zero0.sum"
for stage in 1 2 3; do
  run "g2_fp8_zero$stage" 2 "${gpt[@]}" --precision=fp8 --zero_stage="$stage"
  same_within_rounding "$tmp/g2_fp8_zero0.sum" "$tmp/g2_fp8_zero$stage.sum"
  echo "ok   FP8, 2 ranks, stage $stage"
done

echo "== train_gpt: a stage 3 checkpoint of 2 ranks resumes at stage 0 in 1 process and at stage 1 on 2 ranks"
# The columns that must match: everything but wall-clock time and throughput.
columns() {
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
           { print $col["step"], $col["loss"], $col["lr"], $col["grad_norm"], $col["loss_scale"],
                   $col["skipped_steps"] }' "$1"
}
# The same steps, every number within 1e-5 relative (f32 sums in another order).
close_columns() {
  paste -d' ' <(columns "$1") <(columns "$2") | awk '
    { if (NF != 12) { print "differ: " $0; bad = 1; next }
      for (i = 1; i <= 6; i++) { a = $i; b = $(i + 6); d = a - b; if (d < 0) d = -d;
        m = a < 0 ? -a : a; if (d > 1e-5 * (m > 1 ? m : 1)) { print "differ: " $0; bad = 1; break } } }
    END { exit bad }' || return 1
  [ "$(columns "$1" | wc -l)" -eq "$(columns "$2" | wc -l)" ] || { echo "different step counts"; return 1; }
}
"${gpt[@]}" --metrics="$tmp/full.csv" >"$tmp/full.log" 2>&1 || { cat "$tmp/full.log"; exit 1; }
# The two ranks by hand (under tools:launch the first rank to exit would stop rank 0 while it
# writes the checkpoint); both stop after step 6 (the signal raised after step 5 is agreed on at
# the next step).
rdzv_dir="$(mktemp -d "$tmp/rdzv.XXXXXX")"
stopped=("${gpt[@]}" --world_size=2 --rdzv="file://$rdzv_dir" --zero_stage=3
         --checkpoint_dir="$tmp/ckpt3" --stop_at_step=5)
set +e
"${stopped[@]}" --rank=1 >"$tmp/stopped.1.log" 2>&1 &
pid1=$!
"${stopped[@]}" --rank=0 --metrics="$tmp/stopped.csv" >"$tmp/stopped.log" 2>&1
rc0=$?
wait "$pid1"
rc1=$?
set -e
[ "$rc0" -eq 143 ] && [ "$rc1" -eq 143 ] ||
  { echo "FAIL: the stopped ranks exited $rc0 $rc1, expected 143 143"; cat "$tmp/stopped.log" "$tmp/stopped.1.log"; exit 1; }
grep -F "rank 0: stopped by signal 15 (Terminated) received by rank 0 after step 6; checkpoint in $tmp/ckpt3" "$tmp/stopped.log"
for target in "stage0_ws1 1 --zero_stage=0" "stage1_ws2 2 --zero_stage=1"; do
  read -r name nproc stage <<<"$target"
  cp -r "$tmp/ckpt3" "$tmp/ckpt_$name"
  cp "$tmp/stopped.csv" "$tmp/$name.csv"
  if [ "$nproc" -eq 1 ]; then
    "${gpt[@]}" "$stage" --checkpoint_dir="$tmp/ckpt_$name" --resume --metrics="$tmp/$name.csv" \
      >"$tmp/$name.log" 2>&1 || { echo "FAIL $name"; cat "$tmp/$name.log"; exit 1; }
  else
    "$launch" --nproc="$nproc" -- "${gpt[@]}" --world_size="$nproc" "$stage" \
      --checkpoint_dir="$tmp/ckpt_$name" --resume --metrics="$tmp/$name.csv" \
      >"$tmp/$name.log" 2>&1 || { echo "FAIL $name"; cat "$tmp/$name.log"; exit 1; }
  fi
  grep -qF "resuming after step 6" "$tmp/$name.log" || { echo "FAIL $name: did not resume"; cat "$tmp/$name.log"; exit 1; }
  close_columns "$tmp/full.csv" "$tmp/$name.csv"
  echo "ok   $name: $(columns "$tmp/$name.csv" | wc -l) steps match the uninterrupted run"
done

echo "== misuse"
set +e
"${gpt[@]}" --zero_stage=4 >"$tmp/bad1.log" 2>&1
s1=$?
"${gpt[@]}" --zero_stage=2 >"$tmp/bad2.log" 2>&1
s2=$?
"${gpt[@]}" --grad_accum_steps=3 >"$tmp/bad3.log" 2>&1
s3=$?
set -e
[ "$s1" -eq 1 ] && [ "$s2" -eq 1 ] && [ "$s3" -eq 1 ] || { echo "exit codes $s1 $s2 $s3, expected 1 1 1"; exit 1; }
grep -xF "train_gpt: --zero_stage=4 is outside its valid range [0, 3]" "$tmp/bad1.log"
grep -xF "train_gpt: --zero_stage=2 shards across ranks and needs --world_size >= 2 (one process: --zero_stage=0)" "$tmp/bad2.log"
grep -xF "train_gpt: the batch size 8 does not split evenly across 1 rank x 3 micro-batches (--grad_accum_steps)" "$tmp/bad3.log"
echo "PASS"
