#!/usr/bin/env bash
# Exact resume: a run stopped by SIGTERM (the Ctrl-C path: checkpoint, exit 128 + 15) and resumed
# with --resume logs the same step, loss, lr, grad norm, loss scale and skip count (and FP8
# scales) at every step as an uninterrupted run. Covers train_mnist in f32 and f16 (dynamic loss
# scaling), train_gpt with dropout in bf16, and train_gpt in FP8 with each recipe (the delayed
# recipe's amax histories and scales travel in the checkpoint).
set -euo pipefail
source tests/skip.sh  # relative to the runfiles root, where Bazel runs the test

train_mnist="$1"
train_gpt="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0

# The columns that must match: everything but wall-clock time and throughput (the FP8 scales when
# the run has them).
columns() {
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
           { fp8 = ("fp8_input_scale" in col) ? $col["fp8_input_scale"] " " $col["fp8_weight_scale"] " " $col["fp8_grad_scale"] : ""
             print $col["step"], $col["loss"], $col["lr"], $col["grad_norm"], $col["loss_scale"],
                   $col["skipped_steps"], fp8 }' "$1"
}

check() {  # name binary args...
  local name="$1" bin="$2"
  shift 2
  local dir="$tmp/$name"
  mkdir -p "$dir"
  "$bin" "$@" --metrics="$dir/full.csv" >"$dir/full.log" 2>&1 || {
    echo "FAIL $name: the uninterrupted run failed"; cat "$dir/full.log"; failures=$((failures + 1)); return; }
  local rc=0
  "$bin" "$@" --metrics="$dir/resumed.csv" --checkpoint_dir="$dir/ckpt" --stop_at_step=7 \
    >"$dir/stopped.log" 2>&1 || rc=$?
  if [ "$rc" -ne 143 ]; then
    echo "FAIL $name: the stopped run exited $rc, expected 143"; cat "$dir/stopped.log"
    failures=$((failures + 1)); return
  fi
  grep -q "stopped by signal 15 (Terminated) after step 7" "$dir/stopped.log" || {
    echo "FAIL $name: no stop message"; failures=$((failures + 1)); return; }
  "$bin" "$@" --metrics="$dir/resumed.csv" --checkpoint_dir="$dir/ckpt" --resume \
    >"$dir/resumed.log" 2>&1 || {
    echo "FAIL $name: the resumed run failed"; cat "$dir/resumed.log"; failures=$((failures + 1)); return; }
  if diff <(columns "$dir/full.csv") <(columns "$dir/resumed.csv") >"$dir/diff.txt"; then
    echo "ok   $name: $(columns "$dir/full.csv" | wc -l) steps identical after resuming at step 7"
  else
    echo "FAIL $name: trajectories differ"; head -20 "$dir/diff.txt"; failures=$((failures + 1))
  fi
}

# A text with enough structure for a few steps of a tiny GPT.
text="$tmp/text.txt"
for i in $(seq 1 200); do echo "the quick brown fox $i jumps over the lazy dog"; done >"$text"
check gpt_bf16_dropout "$train_gpt" --data="$text" --steps=16 --n_layer=1 --n_embd=32 \
  --block_size=16 --batch_size=4 --dropout=0.1 --precision=bf16 --eval_every=5 --warmup_steps=4 \
  --eval_batches=2 --sample_tokens=0 --checkpoint_every=0

for recipe in delayed current block; do
  check "gpt_fp8_$recipe" "$train_gpt" --data="$text" --steps=12 --n_layer=1 --n_embd=32 \
    --block_size=16 --batch_size=4 --precision=fp8 --fp8_recipe="$recipe" \
    --fp8_amax_history_len=4 --eval_every=5 --warmup_steps=4 --eval_batches=2 --sample_tokens=0 \
    --checkpoint_every=0
done
# --fp8_head puts the tied head in FP8 too: another trajectory than without it.
"$train_gpt" --data="$text" --steps=4 --n_layer=1 --n_embd=32 --block_size=16 --batch_size=4 \
  --precision=fp8 --fp8_head --eval_every=0 --sample_tokens=0 --checkpoint_every=0 \
  --metrics="$tmp/fp8_head.csv" >"$tmp/fp8_head.log" 2>&1 || { cat "$tmp/fp8_head.log"; exit 1; }
if diff -q <(columns "$tmp/fp8_head.csv" | head -4) \
  <(columns "$tmp/gpt_fp8_delayed/full.csv" | head -4) >/dev/null; then
  echo "FAIL --fp8_head: the same trajectory as without it"; failures=$((failures + 1))
else
  echo "ok   --fp8_head changes the trajectory (the head's GEMMs are FP8)"
fi
# FP8 flags without --precision=fp8 are refused, not ignored.
# A flag given at its default value counts as given.
for args in "--fp8_recipe=block" "--fp8_head" "--fp8_margin=1" "--fp8_recipe=delayed" \
  "--fp8_amax_history_len=1024"; do
  want="--fp8_recipe is set, but --precision=f32 does not train in FP8 (use --precision=fp8)"
  [ "$args" = --fp8_head ] && want="--fp8_head needs --precision=fp8"
  [ "$args" = --fp8_margin=1 ] && want="--fp8_margin is set, but --precision=f32 does not train in FP8 (use --precision=fp8)"
  [ "$args" = --fp8_amax_history_len=1024 ] && want="--fp8_amax_history_len is set, but --precision=f32 does not train in FP8 (use --precision=fp8)"
  if "$train_gpt" --data="$text" --steps=1 $args >"$tmp/refused.log" 2>&1; then
    echo "FAIL $args without --precision=fp8 was accepted"; failures=$((failures + 1))
  elif grep -qF -- "$want" "$tmp/refused.log"; then
    echo "ok   $args without --precision=fp8 is refused"
  else
    echo "FAIL $args: unexpected output"; cat "$tmp/refused.log"; failures=$((failures + 1))
  fi
done
# The delayed scales moved from their start (1) by step 2: the casts happened and were recorded.
awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
         NR == 3 { exit !($col["fp8_weight_scale"] != 1 && $col["fp8_grad_scale"] != 1) }' \
  "$tmp/gpt_fp8_delayed/full.csv" && echo "ok   gpt_fp8_delayed: scales moved" || {
  echo "FAIL gpt_fp8_delayed: the FP8 scales did not move"; head -4 "$tmp/gpt_fp8_delayed/full.csv"
  failures=$((failures + 1)); }

if [ -d /usr/share/datasets/fashion-mnist ]; then
  check mnist_mlp_f32 "$train_mnist" --model=mlp --train_limit=640 --batch_size=64 --epochs=2
  check mnist_mlp_fp8 "$train_mnist" --model=mlp --train_limit=640 --batch_size=64 --epochs=2 \
    --precision=fp8
  # Megatron's 2^32 start skips 15 of these 20 steps: allowed here (--max_skipped_fraction).
  check mnist_cnn_f16 "$train_mnist" --model=cnn --train_limit=320 --batch_size=32 --epochs=2 \
    --precision=f16 --loss_scaler=megatron --max_skipped_fraction=1
else
  # The train_gpt part still runs; the target counts as skipped, not passed (tests/skip.sh).
  skip_part "train_mnist cases: /usr/share/datasets/fashion-mnist is missing (tools/setup.sh installs it)"
fi

# A checkpoint of another configuration is refused with a clear message.
if "$train_gpt" --data="$text" --steps=20 --warmup_steps=4 --n_layer=1 --n_embd=32 --block_size=16 \
  --batch_size=4 --checkpoint_dir="$tmp/gpt_bf16_dropout/ckpt" --resume >"$tmp/other.log" 2>&1; then
  echo "FAIL: resuming another configuration succeeded"; failures=$((failures + 1))
elif grep -qF "the checkpoint was written with precision=bf16, this run has precision=f32 (this setting cannot change when resuming)" "$tmp/other.log"; then
  echo "ok   another configuration is refused"
else
  echo "FAIL: unexpected error"; cat "$tmp/other.log"; failures=$((failures + 1))
fi
exit "$failures"
