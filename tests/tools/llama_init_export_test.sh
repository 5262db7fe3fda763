#!/usr/bin/env bash
# train_llama --init_from / --export_hf end to end, on the checkpoints transformers' save_pretrained
# wrote in tests/nn/testdata (tests/nn/llama_io_reference.py): each converts (--steps=0) to a
# directory that converts again to the same bytes, in f32, bf16 and f16; a Llama fine-tunes for a
# few steps on a token shard and exports; a character-level model trained from scratch exports its
# tokenizer and trains on from its export; misuse is refused with the message that says why.
set -euo pipefail

train_llama="$1"
data="$(cd "$2" && pwd)"  # tests/nn/testdata
launch="$3"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# Convert each, then convert the export again: the same bytes.
for case in hf_llama_gqa_llama3:f32 hf_qwen2_bf16_sharded:bf16 hf_mistral_f16:f16; do
  name="${case%%:*}" dtype="${case##*:}"
  "$train_llama" --init_from="$data/$name" --steps=0 --export_hf="$tmp/$name/x/a" \
    --export_dtype="$dtype" >"$tmp/$name.log" 2>&1 || { fail "$name: exit $?"; cat "$tmp/$name.log"; }
  grep -qF "exported $tmp/$name/x/a/config.json and model.safetensors ($dtype)" "$tmp/$name.log" ||
    { fail "$name: no export line"; cat "$tmp/$name.log"; }
  "$train_llama" --init_from="$tmp/$name/x/a" --steps=0 --export_hf="$tmp/$name/b" \
    --export_dtype="$dtype" >"$tmp/$name.2.log" 2>&1 || { fail "$name: reconvert"; cat "$tmp/$name.2.log"; }
  cmp -s "$tmp/$name/x/a/model.safetensors" "$tmp/$name/b/model.safetensors" ||
    fail "$name: reconverted weights differ"
  cmp -s "$tmp/$name/x/a/config.json" "$tmp/$name/b/config.json" || fail "$name: config.json differs"
done
grep -qF "(HuggingFace safetensors, 3 shards, bf16): vocab=48, hidden=32, layers=2, heads=4, kv_heads=1, head_dim=16" \
  "$tmp/hf_qwen2_bf16_sharded.log" || { fail "qwen2: no model line"; cat "$tmp/hf_qwen2_bf16_sharded.log"; }

# An llm.c token shard of 600 tokens below 48: header {20240520, 1, n, 0...}, then u16 tokens.
le() {  # value bytes
  local v="$1" n="$2" i
  for ((i = 0; i < n; i++)); do printf "\\x$(printf %02x $(((v >> (8 * i)) & 255)))"; done
}
shard="$tmp/tokens.bin"
{
  le 20240520 4; le 1 4; le 600 4
  head -c $((1024 - 12)) /dev/zero
  for ((i = 0; i < 600; i++)); do le $(((i * 37 + i / 7) % 48)) 2; done
} >"$shard"
"$train_llama" --init_from="$data/hf_llama_gqa_llama3" --data="$shard" --steps=3 --warmup_steps=1 \
  --block_size=16 --batch_size=2 --eval_batches=1 --sample_tokens=4 --export_hf="$tmp/ft" \
  --export_dtype=bf16 >"$tmp/ft.log" 2>&1 || { fail "fine-tune: exit $?"; cat "$tmp/ft.log"; }
grep -q "val loss .* after 3 steps" "$tmp/ft.log" || { fail "fine-tune: no val loss"; cat "$tmp/ft.log"; }
"$train_llama" --init_from="$tmp/ft" --steps=0 >"$tmp/ft2.log" 2>&1 ||
  { fail "fine-tuned export does not load"; cat "$tmp/ft2.log"; }
grep -qF "(HuggingFace safetensors, bf16)" "$tmp/ft2.log" || { fail "fine-tuned: not bf16"; cat "$tmp/ft2.log"; }

# A character-level model from scratch: its export carries the characters, and trains on.
text="$tmp/text.txt"
for ((i = 0; i < 40; i++)); do echo "the quick brown fox jumps over the lazy dog $i"; done >"$text"
"$train_llama" --data="$text" --steps=2 --block_size=16 --batch_size=2 --eval_batches=1 \
  --sample_tokens=4 --arch=qwen2 --export_hf="$tmp/chars" >"$tmp/chars.log" 2>&1 ||
  { fail "chars: exit $?"; cat "$tmp/chars.log"; }
[ -f "$tmp/chars/vocab.json" ] || fail "chars: no vocab.json"
grep -q '"model_type": "qwen2"' "$tmp/chars/config.json" || fail "chars: not qwen2"
"$train_llama" --init_from="$tmp/chars" --data="$text" --steps=2 --block_size=16 --batch_size=2 \
  --eval_batches=1 --sample_tokens=4 >"$tmp/chars2.log" 2>&1 ||
  { fail "chars: training on from the export"; cat "$tmp/chars2.log"; }

refused() {  # expected-text args...
  local want="$1"
  shift
  local rc=0
  "$train_llama" "$@" >"$tmp/err.log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    fail "accepted: $*"
  elif ! grep -qF -- "$want" "$tmp/err.log"; then
    fail "$*: no '$want' in:"; cat "$tmp/err.log"
  fi
}
llama="$data/hf_llama_gqa_llama3"
refused "cannot open '$tmp/missing'" --init_from="$tmp/missing" --steps=0
refused "--n_kv_head is given with --init_from=$llama, whose config.json sets the model's shape" \
  --init_from="$llama" --steps=0 --n_kv_head=1
refused "--arch=mistral but --init_from=$llama is model_type \"llama\"" --init_from="$llama" \
  --steps=0 --arch=mistral
refused "--arch=gpt2: expected llama, qwen2 or mistral" --arch=gpt2 --data="$text"
refused "--export_dtype=f8: expected f32, bf16 or f16" --init_from="$llama" --steps=0 \
  --export_dtype=f8
refused "--block_size=65 exceeds the context of --init_from=$data/hf_mistral_f16 (64: its sliding_window)" \
  --init_from="$data/hf_mistral_f16" --data="$shard" --block_size=65
refused "$text is text (" --init_from="$llama" --data="$text"

# ZeRO stage 3 leaves no rank with the whole model: the export is refused before training.
rc=0
"$launch" --nproc=2 -- "$train_llama" --data="$text" --steps=1 --world_size=2 --zero_stage=3 \
  --export_hf="$tmp/z" >"$tmp/z.log" 2>&1 || rc=$?
if [ "$rc" -eq 0 ] || ! grep -qF "export_hf needs the whole model on rank 0, which --zero_stage=3 shards" "$tmp/z.log"; then
  fail "ZeRO stage 3 with --export_hf: exit $rc"; cat "$tmp/z.log"
fi

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all llama init/export checks passed"
