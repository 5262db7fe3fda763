#!/usr/bin/env bash
# The flags train_mnist and train_gpt share are defined once (train/flags.cc, issue 29): --help of
# each binary lists them under "Flags from train/flags.cc:", that block is the same text in both
# (one name, default and help text), neither binary's own file defines one of them again, and
# --help still lists every flag of each binary (absl shows only the main file's flags unless told;
# train::ParseCommandLine tells it). The flags of every language-model trainer are defined once
# in train/language_model.cc, linked into train_gpt and not into train_mnist (which has no --steps
# to ignore). Exact flag lists.
set -uo pipefail

train_mnist="$1"
train_gpt="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0

fail() { echo "FAIL $1"; failures=$((failures + 1)); }

shared="checkpoint_dir device fp8_amax_history_len fp8_margin fp8_recipe grad_accum_steps
loss_scaler max_skipped_fraction max_skipped_in_a_row metrics muon_adjust_lr muon_lr muon_momentum
muon_nesterov muon_ns_steps optimizer precision print_every rank rdzv resume stop_at_step tf32
world_size zero_stage"
own_mnist="batch_size checkpoint_every data_dir epochs lr micro_batch_size model override seed
train_limit weight_decay"
own_gpt="cudnn_attention export_hf fp8_head init_from n_embd n_head n_layer"
language_model="batch_size beta2 block_size checkpoint_every data dropout eval_batches eval_every
grad_clip lr micro_batch_size min_lr override sample_tokens seed steps temperature top_k val_data
warmup_steps weight_decay"

# block HELP FILE: the text of the "Flags from FILE:" block of a --help output.
block() {
  awk -v want="  Flags from $2:" '
    /^  Flags from / { on = ($0 == want); next }
    /^[^ ]/ { on = 0 }
    on { print }' "$1"
}
# names: the flag names of a block on stdin, sorted, one line.
names() { grep -oE '^    --[a-z0-9_]+' | sed 's/^    --//' | sort | tr '\n' ' ' | sed 's/ $//'; }
# expect WHAT GOT WANT
expect() {
  if [ "$2" = "$3" ]; then echo "ok   $1"; else fail "$1: got '$2', expected '$3'"; fi
}
sorted() { tr ' \n' '\n\n' <<<"$1" | grep -v '^$' | sort | tr '\n' ' ' | sed 's/ $//'; }

for bin in mnist gpt; do
  exe=$train_mnist own=$own_mnist lm=""
  [ "$bin" = gpt ] && exe=$train_gpt own=$own_gpt lm=$language_model
  rc=0
  "$exe" --help >"$tmp/$bin.help" 2>&1 || rc=$?
  # absl's --help exits 1 after printing (it stops the program).
  [ "$rc" -le 1 ] || fail "train_$bin --help: exit $rc"
  block "$tmp/$bin.help" train/flags.cc >"$tmp/$bin.shared"
  block "$tmp/$bin.help" "tools/train_$bin.cc" >"$tmp/$bin.own"
  expect "train_$bin: train/flags.cc defines the shared flags" \
    "$(names <"$tmp/$bin.shared")" "$(sorted "$shared")"
  expect "train_$bin: tools/train_$bin.cc defines only its own" \
    "$(names <"$tmp/$bin.own")" "$(sorted "$own")"
  expect "train_$bin: train/language_model.cc defines the language-model flags" \
    "$(block "$tmp/$bin.help" train/language_model.cc | names)" "$(sorted "$lm")"
  expect "train_$bin: --help lists every flag" \
    "$(names <"$tmp/$bin.help")" "$(sorted "$shared $own $lm")"
done
if cmp -s "$tmp/mnist.shared" "$tmp/gpt.shared"; then
  echo "ok   the shared flags read the same in both binaries (defaults and help texts)"
else
  fail "the shared flags' --help differs between the binaries:"
  diff "$tmp/mnist.shared" "$tmp/gpt.shared"
fi
# A default that is printed: the shared flags keep the defaults they had in each binary.
for want in '--optimizer (adamw | adam | sgd | muon (Muon for the hidden matrices with' \
  'biases and norms)); default: "adamw";' '--muon_lr (with --optimizer=muon:' \
  '--device (cpu | cuda | cuda:N); default: "cpu";' '--fp8_recipe (with --precision=fp8: delayed' '--fp8_margin (with --fp8_recipe=delayed:'; do
  if grep -qF -- "$want" "$tmp/gpt.shared"; then echo "ok   $want"; else fail "no '$want'"; fi
done

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "PASS"
