#!/usr/bin/env bash
# Reliability of the training binaries as a user meets it, each case with its exact message:
# numeric flags outside their documented ranges, generation in bf16/f16, the checkpoint directory
# checked (and created with its parents) before the first step, temporaries of interrupted saves
# removed, a checkpoint's counters validated, resume with changed settings (refused unless
# --override names them; then said in the first line and in effect), and divergence stopping the
# run with an error.
set -uo pipefail

train_mnist="$1"
train_gpt="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0

fail() { echo "FAIL $1"; failures=$((failures + 1)); }

# expect NAME RC LINE -- COMMAND...: the command exits RC and prints LINE (a whole line).
expect() {
  local name="$1" want_rc="$2" line="$3"
  shift 4
  local rc=0
  "$@" >"$tmp/$name.log" 2>&1 || rc=$?
  if [ "$rc" -ne "$want_rc" ]; then
    fail "$name: exit $rc, expected $want_rc"; tail -5 "$tmp/$name.log"; return 1
  fi
  if ! grep -qxF -- "$line" "$tmp/$name.log"; then
    fail "$name: no line '$line'"; tail -5 "$tmp/$name.log"; return 1
  fi
  echo "ok   $name"
}

# expect_re NAME RC REGEX -- COMMAND...: as expect, with an extended regular expression for the
# whole line (for checksums and generator offsets).
expect_re() {
  local name="$1" want_rc="$2" re="$3"
  shift 4
  local rc=0
  "$@" >"$tmp/$name.log" 2>&1 || rc=$?
  if [ "$rc" -ne "$want_rc" ]; then
    fail "$name: exit $rc, expected $want_rc"; tail -5 "$tmp/$name.log"; return 1
  fi
  if ! grep -qxE -- "$re" "$tmp/$name.log"; then
    fail "$name: no line matching '$re'"; tail -5 "$tmp/$name.log"; return 1
  fi
  echo "ok   $name"
}

# A checkpoint as written before the whole-header checksum existed (the key renamed, so the
# header keeps its length): its values are checked one by one instead.
without_header_crc() { perl -0pi -e 's/"crc32:__metadata__"/"xrc32:__metadata__"/' "$1"; }

text="$tmp/text.txt"
for i in $(seq 1 200); do echo "the quick brown fox $i jumps over the lazy dog"; done >"$text"
gpt=("$train_gpt" --data="$text" --n_layer=1 --n_embd=32 --block_size=16 --batch_size=4
     --warmup_steps=2 --eval_every=0 --eval_batches=2 --print_every=1 --sample_tokens=0)

echo "== numeric flags outside their ranges"
mnist_data_free=("$train_mnist" --data_dir=/nonexistent)  # the flags are checked first
expect epochs 1 "train_mnist: --epochs=-1 is outside its valid range [0, 100000]" -- \
  "${mnist_data_free[@]}" --epochs=-1
expect train_limit 1 "train_mnist: --train_limit=-5 is outside its valid range [0, 1000000000000]" \
  -- "${mnist_data_free[@]}" --train_limit=-5
expect checkpoint_every 1 \
  "train_mnist: --checkpoint_every=-1 is outside its valid range [0, 1000000000000]" -- \
  "${mnist_data_free[@]}" --checkpoint_every=-1
expect print_every 1 "train_mnist: --print_every=-3 is outside its valid range [1, 1000000000000]" \
  -- "${mnist_data_free[@]}" --print_every=-3
expect print_every0 1 "train_mnist: --print_every=0 is outside its valid range [1, 1000000000000]" \
  -- "${mnist_data_free[@]}" --print_every=0
expect mnist_lr 1 "train_mnist: --lr=0 is outside its valid range (0, 1000]" -- \
  "${mnist_data_free[@]}" --lr=0
expect dropout 1 "train_gpt: --dropout=-0.1 is outside its valid range [0, 1)" -- \
  "${gpt[@]}" --dropout=-0.1
expect dropout1 1 "train_gpt: --dropout=1.5 is outside its valid range [0, 1)" -- \
  "${gpt[@]}" --dropout=1.5
expect top_k 1 "train_gpt: --top_k=-1 is outside its valid range [0, 1000000000000]" -- \
  "${gpt[@]}" --top_k=-1
expect top_k_vocab 1 "train_gpt: --top_k=1000 is outside its valid range [0, 38] (the vocabulary)" \
  -- "${gpt[@]}" --top_k=1000
expect grad_clip 1 "train_gpt: --grad_clip=-1 is outside its valid range [0, 1000000000000]" -- \
  "${gpt[@]}" --grad_clip=-1
expect grad_clip_nan 1 "train_gpt: --grad_clip=nan is outside its valid range [0, 1000000000000]" \
  -- "${gpt[@]}" --grad_clip=nan
expect sample_tokens 1 "train_gpt: --sample_tokens=-1 is outside its valid range [0, 1000000]" -- \
  "${gpt[@]}" --sample_tokens=-1
expect min_lr 1 "train_gpt: --min_lr=0.01 is outside its valid range [0, 0.003]" -- \
  "${gpt[@]}" --min_lr=0.01
expect warmup 1 "train_gpt: --warmup_steps=20 is outside its valid range [0, 10]" -- \
  "${gpt[@]}" --steps=10 --warmup_steps=20

echo "== generation in every precision"
for p in bf16 f16; do
  expect "sample_$p" 0 "----------------" -- "${gpt[@]}" --steps=3 --precision="$p" \
    --sample_tokens=20
done

echo "== the checkpoint directory is checked before training"
nested="$tmp/not/yet/there/ckpt"
if "${gpt[@]}" --steps=2 --checkpoint_dir="$nested" >"$tmp/nested.log" 2>&1 &&
  [ -f "$nested/checkpoint.safetensors" ]; then
  echo "ok   missing parents are created"
else
  fail "missing parents: no checkpoint in $nested"; tail -3 "$tmp/nested.log"
fi
echo "a file" >"$tmp/a_file"
if expect through_file 1 \
  "train_gpt: --checkpoint_dir=$tmp/a_file/ckpt: cannot create $tmp/a_file/ckpt: Not a directory" \
  -- "${gpt[@]}" --steps=2 --checkpoint_dir="$tmp/a_file/ckpt"; then
  grep -q "^step 1" "$tmp/through_file.log" && fail "through_file: trained before failing"
fi

echo "== temporaries of interrupted saves are removed at the next start"
dead_pid=$(sh -c 'echo $$')  # a process that has exited
stale="$nested/checkpoint.safetensors.tmp.$dead_pid.0"
head -c 100000 /dev/zero >"$stale"
echo keep >"$nested/checkpoint.safetensors.tmp.notes"
"${gpt[@]}" --steps=2 --checkpoint_dir="$nested" >"$tmp/stale.log" 2>&1 || fail "stale: run failed"
if [ -e "$stale" ]; then fail "stale: $stale is still there"; else echo "ok   stale temporary removed"; fi
[ -e "$nested/checkpoint.safetensors.tmp.notes" ] || fail "stale: a file of another name was removed"

echo "== resume: counters and settings"
ckpt="$tmp/resume"
run8=("${gpt[@]}" --steps=8 --checkpoint_dir="$ckpt")
"${run8[@]}" --stop_at_step=4 >"$tmp/stopped.log" 2>&1
[ $? -eq 143 ] || fail "the stopped run did not exit 143"
cp "$ckpt/checkpoint.safetensors" "$tmp/good.safetensors"
# A step count the run cannot have (same length, so the header stays valid JSON): the whole-header
# checksum refuses the file.
perl -0pi -e 's/"scalar:step":"4"/"scalar:step":"9"/' "$ckpt/checkpoint.safetensors"
expect_re header_crc 1 \
  "train_gpt: safetensors file '$ckpt/checkpoint.safetensors': the header's CRC-32 is [0-9a-f]{8}, its \"__metadata__\" entry 'crc32:__metadata__' records [0-9a-f]{8} \(the header is corrupt: a metadata value or a tensor's entry changed\)" \
  -- "${run8[@]}" --resume
# Without that checksum, the counter checks refuse it.
without_header_crc "$ckpt/checkpoint.safetensors"
expect bad_step 1 \
  "train_gpt: cannot resume from $ckpt: 'step' is 9; expected an integer in [0, 8] (the run's step count)" \
  -- "${run8[@]}" --resume
# One flipped digit of the schedule's base lr used to resume a run at lr 1.
cp "$tmp/good.safetensors" "$ckpt/checkpoint.safetensors"
without_header_crc "$ckpt/checkpoint.safetensors"
perl -0pi -e 's/"scalar:schedule.base_lrs.0":"0.003/"scalar:schedule.base_lrs.0":"1.003/' \
  "$ckpt/checkpoint.safetensors"
expect base_lr 1 \
  "train_gpt: cannot resume from $ckpt: 'schedule.base_lrs.0' is 1.003 but this run's lr is 0.003 (the setting 'lr' agrees, so the checkpoint is corrupt; --override=lr changes the lr on purpose)" \
  -- "${run8[@]}" --resume
# The data order's generator offset must be the one of the checkpoint's step.
cp "$tmp/good.safetensors" "$ckpt/checkpoint.safetensors"
without_header_crc "$ckpt/checkpoint.safetensors"
perl -0pi -e 's/("batches":"\d+:)(\d)/$1 . (($2 + 1) % 10)/e' "$ckpt/checkpoint.safetensors"
expect_re batches_offset 1 \
  "train_gpt: cannot resume from $ckpt: metadata 'batches' is '[0-9]+:[0-9]+', but step 4 begins at '[0-9]+:[0-9]+'" \
  -- "${run8[@]}" --resume
cp "$tmp/good.safetensors" "$ckpt/checkpoint.safetensors"
expect changed_lr 1 \
  "train_gpt: cannot resume from $ckpt: the checkpoint was written with lr=0.003, this run has lr=0.001 (pass --override=lr to continue with the new value)" \
  -- "${run8[@]}" --resume --lr=0.001
expect changed_wd 1 \
  "train_gpt: cannot resume from $ckpt: the checkpoint was written with weight_decay=0.1, this run has weight_decay=0.2 (pass --override=weight_decay to continue with the new value)" \
  -- "${run8[@]}" --resume --weight_decay=0.2
expect changed_dropout 1 \
  "train_gpt: cannot resume from $ckpt: the checkpoint was written with dropout=0, this run has dropout=0.1 (pass --override=dropout to continue with the new value)" \
  -- "${run8[@]}" --resume --dropout=0.1
# Text of as many distinct characters but other ones ('q' -> 'Q'): the same ids would stand for
# other characters, so --override=data does not make it resumable.
sed 's/q/Q/g' "$text" >"$tmp/text_Q.txt"
expect other_characters 1 \
  "train_gpt: cannot resume from $ckpt: the checkpoint's characters (metadata 'vocab', 38 bytes) differ from those of $tmp/text_Q.txt (38 bytes): its token ids would stand for other characters; resume with text made of the same characters" \
  -- "${run8[@]}" --resume --data="$tmp/text_Q.txt" --override=data
expect fixed_setting 1 \
  "train_gpt: --override=loss_scaler: 'loss_scaler' cannot change when resuming (settings that can: data, val_data, dropout, steps, lr, min_lr, warmup_steps, weight_decay, beta2, grad_clip)" \
  -- "${run8[@]}" --resume --override=loss_scaler
expect override_without_resume 1 "train_gpt: --override=lr applies only with --resume" -- \
  "${run8[@]}" --lr=0.001 --override=lr
# The lr change takes effect: from step 5 on, the resumed run has the lr of a run started with it.
if expect override_lr 0 "resuming with changed settings (--override): lr 0.003 -> 0.001" -- \
  "${run8[@]}" --resume --lr=0.001 --min_lr=0.0003 --override=lr --metrics="$tmp/resumed.csv"; then
  grep -v "^threads: " "$tmp/override_lr.log" | head -1 | grep -qxF "resuming with changed settings (--override): lr 0.003 -> 0.001" ||
    fail "override_lr: the change is not the first output line"
  "${gpt[@]}" --steps=8 --lr=0.001 --min_lr=0.0003 --metrics="$tmp/fresh.csv" >/dev/null 2>&1
  lr_col() { awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } $c["step"] > 4 { print $c["step"], $c["lr"] }' "$1"; }
  if diff <(lr_col "$tmp/fresh.csv") <(lr_col "$tmp/resumed.csv") >/dev/null; then
    echo "ok   the overridden lr is in effect"
  else
    fail "override_lr: lr after resuming differs from a run with --lr=0.001"
    diff <(lr_col "$tmp/fresh.csv") <(lr_col "$tmp/resumed.csv") | head -5
  fi
fi
# A scaler preset over another's checkpoint (f16: PyTorch's scaler by default).
f16_ckpt="$tmp/f16"
"${gpt[@]}" --steps=4 --precision=f16 --checkpoint_dir="$f16_ckpt" >/dev/null 2>&1 ||
  fail "the f16 run failed"
# A loss scale of 0 (in a file without the header checksum) is refused; it used to make every
# master weight NaN at the first resumed step, and the next save overwrote the good checkpoint.
cp "$f16_ckpt/checkpoint.safetensors" "$tmp/f16_good.safetensors"
without_header_crc "$f16_ckpt/checkpoint.safetensors"
perl -0pi -e 's/"scalar:optim.scaler.scale":"65536"/"scalar:optim.scaler.scale":"0.000"/' \
  "$f16_ckpt/checkpoint.safetensors"
expect scale_zero 1 \
  "train_gpt: cannot resume from $f16_ckpt: LossScaler::load_state_dict: 'scale' must be finite and > 0 and in [min_scale, max_scale] = [0, inf], got 0" \
  -- "${gpt[@]}" --steps=8 --precision=f16 --checkpoint_dir="$f16_ckpt" --resume --override=steps
cmp -s "$f16_ckpt/checkpoint.safetensors" "$tmp/f16_good.safetensors" &&
  fail "scale_zero: the edit did not apply"
cp "$tmp/f16_good.safetensors" "$f16_ckpt/checkpoint.safetensors"
expect changed_scaler 1 \
  "train_gpt: cannot resume from $f16_ckpt: the checkpoint was written with loss_scaler=auto, this run has loss_scaler=megatron (this setting cannot change when resuming)" \
  -- "${gpt[@]}" --steps=4 --precision=f16 --checkpoint_dir="$f16_ckpt" --resume --loss_scaler=megatron

echo "== divergence stops the run"
# f32 checks the gradients too: step 7's overflow stops the run (no weight written from it)
# before the loss is NaN at step 8.
expect_re diverged_f32 1 \
  "train_gpt: the run diverged: the gradients of step 7 are not finite \(its loss is [0-9.e+]+\) and no dynamic loss scaler can absorb them \(the step was skipped, no weight changed, but training cannot recover; lower --lr or use another precision\)" \
  -- "${gpt[@]}" --steps=30 --lr=1000 --grad_clip=0 --warmup_steps=0
expect diverged_f16 1 \
  "train_gpt: the run diverged: 3 consecutive steps were skipped (steps 1 to 3 had non-finite gradients at every loss scale tried; --max_skipped_in_a_row=3)" \
  -- "${gpt[@]}" --steps=30 --precision=f16 --loss_scaler=megatron --max_skipped_in_a_row=3

echo "== a run that skipped most of its steps fails"
# Megatron's 2^32 start skips 17 steps of the tiny GPT while the scale settles: most of 20.
expect_re mostly_skipped 1 "val loss [0-9.]+ after 20 steps, 17 skipped" -- \
  "${gpt[@]}" --steps=20 --precision=f16 --loss_scaler=megatron
grep -qxF "train_gpt: the run skipped 17 of its 20 steps (85.0%) for non-finite gradients, more than --max_skipped_fraction=0.5 of them: it did not train (lower --lr, or use bf16 or f32)" \
  "$tmp/mostly_skipped.log" || fail "mostly_skipped: no message"
expect_re settled 0 "val loss [0-9.]+ after 40 steps, 17 skipped" -- \
  "${gpt[@]}" --steps=40 --precision=f16 --loss_scaler=megatron
expect_re allowed 0 "val loss [0-9.]+ after 20 steps, 17 skipped" -- \
  "${gpt[@]}" --steps=20 --precision=f16 --loss_scaler=megatron --max_skipped_fraction=1
expect skipped_fraction_flag 1 \
  "train_gpt: --max_skipped_fraction=1.5 is outside its valid range [0, 1]" -- \
  "${gpt[@]}" --max_skipped_fraction=1.5

exit "$failures"
