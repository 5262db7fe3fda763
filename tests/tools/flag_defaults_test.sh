#!/usr/bin/env bash
# train_gpt's flags as a user types them (issue 28, "Flags and logs"):
# - a default never makes a valid command fail: --steps=5 without --warmup_steps (the default
#   100 used to fail: "--warmup_steps=100 is outside its valid range [0, 5]"), --lr=1e-4 without
#   --min_lr, --n_head=3 without --n_embd, --grad_accum_steps=3 with the default batch,
#   --init_from of a 32-token context without --block_size; an
#   explicit value out of range still fails naming it;
# - --batch_size is the global batch: the first output line says global = micro x accumulation x
#   ranks, --micro_batch_size gives the per-pass batch, a global batch that does not split is
#   refused (DataParallel's message) and two batch flags that disagree are refused naming both;
# - the metrics CSV writes the scale this step's backward used and the next one exactly (2^32 of
#   --loss_scaler=deepspeed_class is 4294967296, not 4294967300); --loss_scaler=deepspeed starts
#   at DeepSpeed's engine default 2^16.
set -uo pipefail

train_gpt="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0

fail() { echo "FAIL $1"; failures=$((failures + 1)); }

# run NAME RC -- COMMAND...: the command exits RC (its output in $tmp/NAME.log).
run() {
  local name="$1" want_rc="$2"
  shift 3
  local rc=0
  "$@" >"$tmp/$name.log" 2>&1 || rc=$?
  if [ "$rc" -ne "$want_rc" ]; then
    fail "$name: exit $rc, expected $want_rc"; tail -5 "$tmp/$name.log"; return 1
  fi
}
# has NAME TEXT: the output of NAME has TEXT (a fixed string) somewhere.
has() {
  if grep -qF -- "$2" "$tmp/$1.log"; then echo "ok   $1: $2"; else
    fail "$1: no '$2' in:"; head -5 "$tmp/$1.log"; fi
}
# first NAME LINE: the first line of NAME's output is LINE, after the line that says how the CPU
# pool was sized (`threads: ...`, which every run prints before anything else).
first() {
  local got
  got=$(grep -v "^threads: " "$tmp/$1.log" | head -n 1)
  if [ "$got" = "$2" ]; then echo "ok   $1: first line"; else
    fail "$1: first line '$got', expected '$2'"; fi
}

text="$tmp/text.txt"
for i in $(seq 1 60); do echo "the quick brown fox $i jumps over the lazy dog"; done >"$text"
small=(--data="$text" --n_layer=1 --n_head=1 --n_embd=8 --block_size=8 --sample_tokens=0
       --eval_batches=1 --print_every=1000)

echo "== defaults that adapt to the flags given"
run short 0 -- "$train_gpt" "${small[@]}" --steps=5 --batch_size=2
has short "warmup_steps=0"
first short "batch: global 2 sequences per optimizer step = micro-batch 2 x 1 accumulation step x 1 rank"
run long 0 -- "$train_gpt" "${small[@]}" --steps=100 --batch_size=2 --eval_every=0
has long "warmup_steps=100"  # the old default wherever it fitted
run low_lr 0 -- "$train_gpt" "${small[@]}" --steps=2 --batch_size=2 --lr=1e-4
has low_lr "min_lr=1e-05"
run default_lr 0 -- "$train_gpt" "${small[@]}" --steps=2 --batch_size=2
has default_lr "min_lr=3e-04"
run three_heads 0 -- "$train_gpt" --data="$text" --n_layer=1 --n_head=3 --block_size=8 \
  --sample_tokens=0 --eval_batches=1 --steps=1 --batch_size=2
has three_heads "n_embd=66"
run accum3 0 -- "$train_gpt" "${small[@]}" --steps=1 --grad_accum_steps=3
first accum3 "batch: global 30 sequences per optimizer step = micro-batch 10 x 3 accumulation steps x 1 rank"
# --init_from of a model with a context of 32: the default --block_size (64) follows it.
le() {  # value bytes: little-endian
  local v="$1" n="$2" i
  for ((i = 0; i < n; i++)); do printf "\\x$(printf %02x $(((v >> (8 * i)) & 255)))"; done
}
# llm.c model file, version 3: maxT 32, V = Vp = 1000, 1 layer, 1 head, 4 channels; 4380 zero f32
# parameters (wte 4000, wpe 128, the block 244, ln_f 8).
{
  le 20240326 4; le 3 4; le 32 4; le 1000 4; le 1 4; le 1 4; le 4 4; le 1000 4
  head -c $((1024 - 32)) /dev/zero
  head -c $((4 * 4380)) /dev/zero
} >"$tmp/ctx32.bin"
# An llm.c token shard of 1000 zero tokens.
{ le 20240520 4; le 1 4; le 1000 4; head -c $((1024 - 12)) /dev/zero; head -c 2000 /dev/zero; } \
  >"$tmp/train.bin"
run init_ctx32 0 -- "$train_gpt" --init_from="$tmp/ctx32.bin" --data="$tmp/train.bin" --steps=1 \
  --batch_size=1 --eval_batches=1 --sample_tokens=0
has init_ctx32 "block_size=32"
echo "== explicit values are checked"
run block_too_long 1 -- "$train_gpt" --init_from="$tmp/ctx32.bin" --data="$tmp/train.bin" \
  --steps=1 --batch_size=1 --block_size=64 --sample_tokens=0
has block_too_long "train_gpt: --block_size=64 exceeds the context of --init_from=$tmp/ctx32.bin (32)"
run warmup_too_long 1 -- "$train_gpt" "${small[@]}" --steps=5 --warmup_steps=10
has warmup_too_long "train_gpt: --warmup_steps=10 is outside its valid range [0, 5]"
run min_lr_too_high 1 -- "$train_gpt" "${small[@]}" --steps=5 --lr=1e-4 --min_lr=3e-4
has min_lr_too_high "train_gpt: --min_lr=3e-04 is outside its valid range [0, 1e-04]"

echo "== the global batch and the micro-batch"
run micro 0 -- "$train_gpt" "${small[@]}" --steps=1 --micro_batch_size=2 --grad_accum_steps=2
first micro "batch: global 4 sequences per optimizer step = micro-batch 2 x 2 accumulation steps x 1 rank"
has micro "batch_size=4"
run odd_global 1 -- "$train_gpt" "${small[@]}" --steps=1 --batch_size=3 --grad_accum_steps=2
has odd_global "train_gpt: the batch size 3 does not split evenly across 1 rank x 2 micro-batches (--grad_accum_steps)"
run both 1 -- "$train_gpt" "${small[@]}" --steps=1 --batch_size=8 --micro_batch_size=2 --grad_accum_steps=2
has both "train_gpt: --batch_size=8 (the global batch of an optimizer step) is not --micro_batch_size=2 x --grad_accum_steps=2 x --world_size=1 = 4; give one of the two"

echo "== loss scales in the metrics CSV"
run ds_class 0 -- "$train_gpt" "${small[@]}" --steps=2 --batch_size=2 --precision=f16 \
  --loss_scaler=deepspeed_class --max_skipped_fraction=1 --metrics="$tmp/class.csv"
has ds_class "loss_scaler=deepspeed_class"
# The columns by name: step 1 used 2^32, whatever it did to it.
scale_of() {  # FILE COLUMN ROW
  awk -F, -v name="$2" -v row="$3" 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    NR == row + 1 { print $col[name] }' "$1"
}
[ "$(scale_of "$tmp/class.csv" loss_scale 1)" = 4294967296 ] && echo "ok   class.csv: 4294967296" ||
  fail "class.csv: step 1 loss_scale '$(scale_of "$tmp/class.csv" loss_scale 1)', expected 4294967296"
# The next step's scale is the one step 2 used.
[ "$(scale_of "$tmp/class.csv" loss_scale_next 1)" = "$(scale_of "$tmp/class.csv" loss_scale 2)" ] &&
  echo "ok   class.csv: loss_scale_next of step 1 is the loss_scale of step 2" ||
  fail "class.csv: loss_scale_next of step 1 is not the loss_scale of step 2"
run ds_engine 0 -- "$train_gpt" "${small[@]}" --steps=1 --batch_size=2 --precision=f16 \
  --loss_scaler=deepspeed --max_skipped_fraction=1 --metrics="$tmp/engine.csv"
[ "$(scale_of "$tmp/engine.csv" loss_scale 1)" = 65536 ] && echo "ok   engine.csv: 65536" ||
  fail "engine.csv: step 1 loss_scale '$(scale_of "$tmp/engine.csv" loss_scale 1)', expected 65536"

if [ "$failures" -eq 0 ]; then echo "all passed"; else echo "$failures failed"; exit 1; fi
