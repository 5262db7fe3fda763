#!/usr/bin/env bash
# --optimizer=muon in the training binaries (Muon for the hidden matrices, AdamW for the
# embeddings, the head, norms and biases, as one optimizer): on the tiny Shakespeare text
# 1. train_gpt with Muon for 200 steps ends below AdamW's validation loss of the same run (Muon
#    is the faster optimizer here: 0.5 x the steps reach AdamW's 1500-step loss, see
#    tools/bench/muon_vs_adamw.sh);
# 2. a bf16 train_llama run stopped at step 40 and resumed gives the uninterrupted run's metrics
#    rows (Muon's momentum buffers, AdamW's moments and the schedule in the checkpoint);
# 3. DDP on 2 ranks follows one process's losses to 1e-3 (every rank orthogonalises the same
#    averaged gradients; the average over ranks sums in another order than one process's batch,
#    as with AdamW, so not to the bit);
# 4. ZeRO stages 1 and 3 on 2 ranks give DDP's losses bit for bit (the momentum on each rank's
#    shard, each matrix orthogonalised by one rank and broadcast);
# 5. the refusals: an unknown --muon_adjust_lr, a --muon_lr out of range, a changed Muon setting
#    on resume.
set -euo pipefail

train_gpt="$1" train_llama="$2" launch="$3" text="$4"
tmp="${TEST_TMPDIR:-/tmp}"
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
common=(--data="$text" --batch_size=16 --lr=6e-3 --print_every=1000 --sample_tokens=0)
final_val() { sed -n "s/^val loss \([0-9.]*\) after $2 steps, 0 skipped$/\1/p" "$1"; }

for opt in adamw muon; do
  "$train_gpt" "${common[@]}" --steps=200 --warmup_steps=20 --eval_every=200 --optimizer="$opt" \
    >"$tmp/$opt.log" 2>&1 || { fail "$opt: exit $?"; cat "$tmp/$opt.log"; }
done
adamw=$(final_val "$tmp/adamw.log" 200) muon=$(final_val "$tmp/muon.log" 200)
echo "200 steps: AdamW val loss ${adamw:-none}, Muon ${muon:-none}"
awk -v m="$muon" -v a="$adamw" 'BEGIN { exit !(m != "" && a != "" && m < a) }' ||
  fail "Muon (${muon:-none}) is not below AdamW (${adamw:-none})"
grep -qF "optimizer=muon muon_lr=0.02 muon_momentum=0.95 muon_nesterov=yes muon_ns_steps=5 muon_adjust_lr=original" \
  "$tmp/muon.log" || { fail "no Muon settings line"; cat "$tmp/muon.log"; }

run=("$train_llama" "${common[@]}" --steps=80 --warmup_steps=10 --eval_every=40 --precision=bf16
  --optimizer=muon --muon_adjust_lr=match_rms_adamw --muon_lr=6e-3)
"${run[@]}" --metrics="$tmp/straight.csv" >"$tmp/straight.log" 2>&1 ||
  { fail "straight: exit $?"; cat "$tmp/straight.log"; }
status=0
"${run[@]}" --metrics="$tmp/resumed.csv" --checkpoint_dir="$tmp/ckpt" --stop_at_step=40 \
  >"$tmp/stop.log" 2>&1 || status=$?
[ "$status" -ne 0 ] && [ -f "$tmp/ckpt/checkpoint.safetensors" ] ||
  { fail "the stopped run left no checkpoint (exit $status)"; cat "$tmp/stop.log"; }
"${run[@]}" --metrics="$tmp/resumed.csv" --checkpoint_dir="$tmp/ckpt" --resume \
  >"$tmp/resume.log" 2>&1 || { fail "resume: exit $?"; cat "$tmp/resume.log"; }
# Columns 1-8: step, epoch, loss, lr, grad_norm, loss_scale, loss_scale_next, skipped_steps.
diff <(cut -d, -f1-8 "$tmp/straight.csv") <(cut -d, -f1-8 "$tmp/resumed.csv") ||
  fail "the resumed run's metrics differ from the uninterrupted run's (above)"

"$train_gpt" "${common[@]}" --steps=20 --warmup_steps=5 --eval_every=20 --optimizer=muon \
  --metrics="$tmp/one.csv" >"$tmp/one.log" 2>&1 || { fail "one process"; cat "$tmp/one.log"; }
"$launch" --nproc=2 -- "$train_gpt" "${common[@]}" --steps=20 --warmup_steps=5 --eval_every=20 \
  --optimizer=muon --world_size=2 --metrics="$tmp/ddp.csv" >"$tmp/ddp.log" 2>&1 ||
  { fail "ddp: exit $?"; cat "$tmp/ddp.log"; }
paste -d, <(cut -d, -f1,3 "$tmp/one.csv") <(cut -d, -f3 "$tmp/ddp.csv") | awk -F, '
  NR > 1 { d = $2 - $3; if (d < 0) d = -d; if (d > 1e-3 * $2) { print "step " $1 ": " $2 " vs " $3; bad = 1 } }
  END { exit bad }' || fail "DDP's losses differ from one process's by more than 1e-3 (above)"
[ "$(wc -l <"$tmp/one.csv")" -eq "$(wc -l <"$tmp/ddp.csv")" ] || fail "DDP ran another number of steps"
for stage in 1 3; do
  "$launch" --nproc=2 -- "$train_gpt" "${common[@]}" --steps=20 --warmup_steps=5 --eval_every=20 \
    --optimizer=muon --world_size=2 --zero_stage=$stage --metrics="$tmp/zero$stage.csv" \
    >"$tmp/zero$stage.log" 2>&1 || { fail "zero stage $stage: exit $?"; cat "$tmp/zero$stage.log"; }
  diff <(cut -d, -f1,3 "$tmp/ddp.csv") <(cut -d, -f1,3 "$tmp/zero$stage.csv") ||
    fail "ZeRO stage $stage's losses differ from DDP's (above)"
done

refused() {  # expected-text command...
  local want="$1"
  shift
  local rc=0
  "$@" >"$tmp/err.log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    fail "accepted: $*"
  elif ! grep -qF -- "$want" "$tmp/err.log"; then
    fail "$*: no '$want' in:"; cat "$tmp/err.log"
  fi
}
refused "unknown Muon adjust_lr 'rms' (expected original, match_rms_adamw or spectral_unclamped)" \
  "$train_gpt" "${common[@]}" --steps=5 --optimizer=muon --muon_adjust_lr=rms
refused "--muon_lr" "$train_gpt" "${common[@]}" --steps=5 --optimizer=muon --muon_lr=0
refused "muon_ns_steps" "${run[@]}" --checkpoint_dir="$tmp/ckpt" --resume --muon_ns_steps=3

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all Muon training checks passed"
