#!/usr/bin/env bash
# train_gpt's evaluation and data checks, each case with its exact output:
# - the validation loss is the one PyTorch's autocast gives (cross-entropy in f32, sums in f64) in
#   every precision: a GPT-2 of zero weights (llm.c file) has zero logits, so every token's loss is
#   exactly ln(V), before and after a step (its gradients are zero); at 80 x 128 tokens an f16
#   sum of the batch's losses (70700) would be inf and a bf16 one 6.9000 per token;
# - --val_data in another tokenizer than --data (text with a token shard) is refused naming both;
# - every token of every file is checked at load: an id outside the vocabulary in --val_data or
#   in the last 10% of --data is refused naming the file, its index and byte offset;
# - an attention too large for memory (--block_size=100000 under a 6 GB address-space limit)
#   exits 1 with the out-of-memory error, not an abort.
set -uo pipefail
source tests/skip.sh  # relative to the runfiles root, where Bazel runs the test

train_gpt="$1"
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

le() {  # value bytes: little-endian
  local v="$1" n="$2" i
  for ((i = 0; i < n; i++)); do printf "\\x$(printf %02x $(((v >> (8 * i)) & 255)))"; done
}
# shard PATH N [INDEX TOKEN]: an llm.c token shard of N zero tokens, token INDEX set to TOKEN.
shard() {
  local path="$1" n="$2"
  { le 20240520 4; le 1 4; le "$n" 4; head -c $((1024 - 12)) /dev/zero; } >"$path"
  if [ $# -eq 4 ]; then
    head -c $((2 * $3)) /dev/zero >>"$path"
    le "$4" 2 >>"$path"
    head -c $((2 * (n - $3 - 1))) /dev/zero >>"$path"
  else
    head -c $((2 * n)) /dev/zero >>"$path"
  fi
}

echo "== the validation loss in every precision"
# llm.c model file, version 3: maxT 128, V = Vp = 1000, 1 layer, 1 head, 4 channels; 4764 zero
# f32 parameters (wte 4000, wpe 512, the block 244, ln_f 8).
model="$tmp/zero.bin"
{
  le 20240326 4; le 3 4; le 128 4; le 1000 4; le 1 4; le 1 4; le 4 4; le 1000 4
  head -c $((1024 - 32)) /dev/zero
  head -c $((4 * 4764)) /dev/zero
} >"$model"
shard "$tmp/train.bin" 1000
shard "$tmp/val.bin" 10241  # one evaluation batch of 80 windows of 128
# ln(1000) = 6.907755...
for p in f32 f16 bf16; do
  expect "val_loss_$p" 0 "val loss 6.9078 after 1 steps, 0 skipped" -- \
    "$train_gpt" --init_from="$model" --data="$tmp/train.bin" --val_data="$tmp/val.bin" \
    --precision="$p" --steps=1 --warmup_steps=0 --batch_size=80 --block_size=128 \
    --eval_batches=1 --sample_tokens=0
done

echo "== --val_data in another tokenizer than --data"
text="$tmp/text.txt"
for i in $(seq 1 50); do echo "the quick brown fox $i jumps over the lazy dog"; done >"$text"
small=(--n_layer=1 --n_embd=8 --n_head=1 --block_size=8 --batch_size=2 --steps=1
       --warmup_steps=0 --sample_tokens=0)
expect text_with_shard 1 "train_gpt: the validation data and the training data use different tokenizers, so the validation loss would mean nothing: '$tmp/val.bin' is an llm.c token shard (GPT-2 token ids), '$text' is text (tokenized by its bytes); give both as text or both as token shards (.bin)" -- \
  "$train_gpt" --data="$text" --val_data="$tmp/val.bin" "${small[@]}"
expect shard_with_text 1 "train_gpt: the validation data and the training data use different tokenizers, so the validation loss would mean nothing: '$text' is text (tokenized by its bytes), '$tmp/train.bin' is an llm.c token shard (GPT-2 token ids); give both as text or both as token shards (.bin)" -- \
  "$train_gpt" --data="$tmp/train.bin" --val_data="$text" "${small[@]}"
printf 'the lazy fox!' >"$tmp/val.txt"
expect text_new_byte 1 "train_gpt: validation text '$tmp/val.txt' uses a byte that training text '$text' does not, so the model has no token for it: CharTokenizer::Encode: byte 0x21 ('!') at position 12 is not in the vocabulary of 38 bytes" -- \
  "$train_gpt" --data="$text" --val_data="$tmp/val.txt" "${small[@]}"

echo "== every token checked at load"
shard "$tmp/bad_val.bin" 100 57 60000
expect bad_val_data 1 "train_gpt: '$tmp/bad_val.bin': token 60000 at index 57 (byte offset 1138) is outside the vocabulary of 50257 (ids 0..50256)" -- \
  "$train_gpt" --data="$tmp/train.bin" --val_data="$tmp/bad_val.bin" "${small[@]}"
shard "$tmp/bad_tail.bin" 1000 995 50257  # in the last 10%, the validation split
expect bad_split_tail 1 "train_gpt: '$tmp/bad_tail.bin': token 50257 at index 995 (byte offset 3014) is outside the vocabulary of 50257 (ids 0..50256)" -- \
  "$train_gpt" --data="$tmp/bad_tail.bin" "${small[@]}"

echo "== out of memory"
# The address-space limit makes the failure the same on every machine (overcommit settings, RAM);
# AddressSanitizer's shadow memory cannot live under it, so a sanitized build skips this case.
if grep -qa __asan_init "$train_gpt"; then
  skip_part "attention_oom: an AddressSanitizer build cannot run under ulimit -v"
else
  yes ab | head -c 100100 >"$tmp/long.txt"
  expect attention_oom 1 "train_gpt: CPU allocator: out of memory allocating 40000000000 bytes (a kernel's scratch buffer)" -- \
    bash -c 'ulimit -v 6000000 && exec "$@"' oom "$train_gpt" --data="$tmp/long.txt" \
    --val_data="$tmp/long.txt" --block_size=100000 --n_layer=1 --n_embd=8 --n_head=1 \
    --batch_size=1 --steps=1 --warmup_steps=0 --sample_tokens=0
fi

if [ "$failures" -eq 0 ]; then echo "all passed"; else echo "$failures failed"; exit 1; fi
