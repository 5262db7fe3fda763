#!/usr/bin/env bash
# train_gpt --init_from / --export_hf end to end: the tiny transformers GPT-2 of
# tests/nn/testdata/gpt2_tiny_hf converts (--steps=0) to a directory that converts again to the
# same bytes, fine-tunes for a few steps on a token shard and exports, and misuse is refused with
# the message that says why. The export keeps config.json's dropouts; a character-level model's
# export declares no end-of-text character and carries its vocabulary; a model.safetensors
# without config.json needs --n_head; a pytorch_model.bin gets the way to convert it.
set -euo pipefail

train_gpt="$1"
tiny="$2"  # the directory of the tiny model
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# Convert, and convert the result again: the same file.
"$train_gpt" --init_from="$tiny" --steps=0 --export_hf="$tmp/a" >"$tmp/a.log" 2>&1 ||
  { fail "convert: exit $?"; cat "$tmp/a.log"; }
grep -q "vocab=100, block_size=32, n_layer=2, n_head=2, n_embd=16" "$tmp/a.log" ||
  { fail "convert: no model line"; cat "$tmp/a.log"; }
"$train_gpt" --init_from="$tmp/a" --steps=0 --export_hf="$tmp/b" >"$tmp/b.log" 2>&1 ||
  { fail "reconvert: exit $?"; cat "$tmp/b.log"; }
cmp -s "$tmp/a/model.safetensors" "$tmp/b/model.safetensors" || fail "reconvert: files differ"
cmp -s "$tmp/a/config.json" "$tmp/b/config.json" || fail "reconvert: config.json differs"
[ -z "$(ls "$tmp/a" | grep -v '^model.safetensors$\|^config.json$' || true)" ] ||
  fail "export left other files: $(ls "$tmp/a")"

# An llm.c token shard of 600 tokens below 100: header {20240520, 1, n, 0...}, then u16 tokens.
le() {  # value bytes
  local v="$1" n="$2" i
  for ((i = 0; i < n; i++)); do printf "\\x$(printf %02x $(((v >> (8 * i)) & 255)))"; done
}
shard="$tmp/tokens.bin"
{
  le 20240520 4; le 1 4; le 600 4
  head -c $((1024 - 12)) /dev/zero
  for ((i = 0; i < 600; i++)); do le $(((i * 37 + i / 7) % 100)) 2; done
} >"$shard"
"$train_gpt" --init_from="$tiny" --data="$shard" --steps=3 --warmup_steps=1 --block_size=16 \
  --batch_size=2 --eval_batches=1 --sample_tokens=4 --export_hf="$tmp/ft" >"$tmp/ft.log" 2>&1 ||
  { fail "fine-tune: exit $?"; cat "$tmp/ft.log"; }
grep -q "val loss .* after 3 steps" "$tmp/ft.log" || { fail "fine-tune: no val loss"; cat "$tmp/ft.log"; }
"$train_gpt" --init_from="$tmp/ft" --steps=0 >"$tmp/ft2.log" 2>&1 ||
  { fail "fine-tuned export does not load"; cat "$tmp/ft2.log"; }
cmp -s "$tmp/a/model.safetensors" "$tmp/ft/model.safetensors" && fail "fine-tuning changed nothing"

refused() {  # expected-text args...
  local want="$1"
  shift
  local rc=0
  "$train_gpt" "$@" >"$tmp/err.log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    fail "accepted: $*"
  elif ! grep -qF -- "$want" "$tmp/err.log"; then
    fail "$*: no '$want' in:"; cat "$tmp/err.log"
  fi
}
refused "cannot open '$tmp/missing.safetensors'" --init_from="$tmp/missing.safetensors" --steps=0
# An explicit --block_size above the file's context (the default follows it: min(64, 32)).
refused "--block_size=64 exceeds the context of --init_from=$tiny (32)" --init_from="$tiny" \
  --data="$shard" --steps=1 --warmup_steps=0 --block_size=64
text="$tmp/text.txt"
echo "the quick brown fox jumps over the lazy dog" >"$text"
refused "has a vocabulary of 100: train it on token shards" --init_from="$tiny" --data="$text" \
  --steps=1 --warmup_steps=0 --block_size=4
refused "--steps=0 is outside its valid range" --data="$shard" --steps=0
# A NaN weight (the file has no checksums, as transformers writes it) is refused by name.
mkdir -p "$tmp/nan" && cp -L "$tiny"/* "$tmp/nan/" && chmod -R u+w "$tmp/nan"
n=$(od -An -tu8 -N8 "$tmp/nan/model.safetensors" | tr -d ' ')
printf '\x00\x00\xc0\x7f' | dd of="$tmp/nan/model.safetensors" bs=1 seek=$((8 + n + 8)) \
  conv=notrunc 2>/dev/null
refused "train_gpt: --init_from=$tmp/nan: tensor 'blocks.0.attn.qkv.bias' holds nan at element 2 of 48 (1 of its elements is not finite) (a model's weights must be finite)" \
  --init_from="$tmp/nan" --steps=0
head -c 2000 "$tmp/a/model.safetensors" >"$tmp/cut.safetensors"
refused "cut.safetensors" --init_from="$tmp/cut.safetensors" --steps=0

# The export keeps the dropouts of --init_from's config.json (--dropout, when given, sets them).
mkdir -p "$tmp/drop" && cp -L "$tiny"/* "$tmp/drop/" && chmod -R u+w "$tmp/drop"
sed -i 's/"resid_pdrop": 0.0/"resid_pdrop": 0.1/; s/"embd_pdrop": 0.0/"embd_pdrop": 0.2/;
  s/"attn_pdrop": 0.0/"attn_pdrop": 0.3/' "$tmp/drop/config.json"
"$train_gpt" --init_from="$tmp/drop" --steps=0 --export_hf="$tmp/drop_out" >"$tmp/drop.log" 2>&1 ||
  { fail "dropouts: exit $?"; cat "$tmp/drop.log"; }
for field in '"resid_pdrop": 0.1,' '"embd_pdrop": 0.2,' '"attn_pdrop": 0.3,' '"eos_token_id": 99,'; do
  grep -qF -- "$field" "$tmp/drop_out/config.json" || fail "dropouts: no $field in export"
done
"$train_gpt" --init_from="$tmp/drop" --steps=0 --dropout=0.05 --export_hf="$tmp/drop_set" \
  >"$tmp/drop_set.log" 2>&1 || { fail "--dropout: exit $?"; cat "$tmp/drop_set.log"; }
[ "$(grep -c '_pdrop": 0.05,' "$tmp/drop_set/config.json")" -eq 3 ] ||
  { fail "--dropout=0.05 not in the export"; cat "$tmp/drop_set/config.json" || true; }

# A character-level model (a pangram: 'z' is the last of its 28 ids) exports without an
# end-of-text token and with its characters as a GPT2Tokenizer (GPT-2's byte-level names:
# '\n' is U+010A, ' ' U+0120).
"$train_gpt" --data="$text" --steps=2 --warmup_steps=0 --block_size=4 --batch_size=2 \
  --n_layer=1 --n_head=2 --n_embd=8 --eval_batches=1 --sample_tokens=0 --export_hf="$tmp/char" \
  >"$tmp/char.log" 2>&1 || { fail "char export: exit $?"; cat "$tmp/char.log"; }
for field in '"eos_token_id": null,' '"bos_token_id": null,' '"vocab_size": 28'; do
  grep -qF -- "$field" "$tmp/char/config.json" || fail "char export: no $field in config.json"
done
for field in '"z": 27' '"a": 2' $'"\xc4\x8a": 0' $'"\xc4\xa0": 1'; do
  grep -qF -- "$field" "$tmp/char/vocab.json" || fail "char export: no $field in vocab.json"
done
[ "$(grep -c ': ' "$tmp/char/vocab.json")" -eq 28 ] || fail "char export: vocab.json size"
[ "$(cat "$tmp/char/merges.txt")" = "#version: 0.2" ] || fail "char export: merges.txt"
grep -qF '"tokenizer_class": "GPT2Tokenizer"' "$tmp/char/tokenizer_config.json" ||
  fail "char export: tokenizer_config.json"
"$train_gpt" --init_from="$tmp/char" --data="$text" --steps=1 --warmup_steps=0 --block_size=4 \
  --batch_size=2 --eval_batches=1 --sample_tokens=0 --export_hf="$tmp/char2" >"$tmp/char2.log" 2>&1 ||
  { fail "char re-import: exit $?"; cat "$tmp/char2.log"; }
cmp -s "$tmp/char/vocab.json" "$tmp/char2/vocab.json" || fail "char re-export: vocab.json differs"
# Text of as many characters but other ones ('q' -> 'Q') would remap every id: refused.
sed 's/q/Q/g' "$text" >"$tmp/text_Q.txt"
refused "$tmp/text_Q.txt is text whose characters differ from those of --init_from=$tmp/char (its vocab.json): its token ids would stand for other characters" \
  --init_from="$tmp/char" --data="$tmp/text_Q.txt" --steps=1 --block_size=4 --batch_size=2

# model.safetensors without config.json: the head count is not guessed.
mkdir -p "$tmp/bare" && cp -L "$tiny/model.safetensors" "$tmp/bare/"
refused "cannot tell the number of heads: there is no config.json beside it ('$tmp/bare/config.json'); put the model's config.json there, or give the head count (train_gpt --n_head" \
  --init_from="$tmp/bare" --steps=0
"$train_gpt" --init_from="$tmp/bare" --n_head=2 --steps=0 >"$tmp/bare.log" 2>&1 ||
  { fail "--n_head=2: exit $?"; cat "$tmp/bare.log"; }
grep -q "n_head=2, n_embd=16" "$tmp/bare.log" || { fail "--n_head=2: no model line"; cat "$tmp/bare.log"; }
refused "n_head' is 2 but" --init_from="$tiny" --n_head=4 --steps=0

# A directory with only PyTorch's pickle: how to convert it.
mkdir -p "$tmp/pt" && printf 'PK\003\004pickle' >"$tmp/pt/pytorch_model.bin"
refused "'$tmp/pt/pytorch_model.bin' is a PyTorch pickle (pytorch_model.bin), which tapegrad does not read" \
  --init_from="$tmp/pt" --steps=0
refused "save_pretrained('$tmp/pt', safe_serialization=True)" --init_from="$tmp/pt" --steps=0

if [ "$failures" -eq 0 ]; then echo "all passed"; else echo "$failures failed"; exit 1; fi
