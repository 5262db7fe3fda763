#!/usr/bin/env bash
# The tiny Llama decoder against the tiny GPT on the Shakespeare text (issue 43's target): both
# binaries with their default shapes (train_llama: 2 layers, 64 wide, 4 query heads on 2
# key/value heads, SwiGLU 192, RMSNorm, rotary, untied head: 106,944 parameters; train_gpt: 2
# layers, 64 wide, 4 heads, GELU MLP 256, LayerNorm, learned positions, tied head: 108,352) and
# the same run (steps, batch, lr, schedule, seed), the validation loss every EVERY steps. Prints
# both curves side by side per seed and exits 1 when the Llama's final loss is above the GPT's for
# any seed.
#
#   tools/bench/llama_vs_gpt.sh [shared flags...]     (e.g. --precision=bf16)
#
# STEPS (default 1500), EVERY (250) and SEEDS ("1 2 3") from the environment; extra flags for
# bazel in BAZEL_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel build -c opt ${BAZEL_FLAGS:-} //tools:train_gpt //tools:train_llama >&2
steps="${STEPS:-1500}" every="${EVERY:-250}"
dir="$(mktemp -d)"
trap 'rm -rf "${dir}"' EXIT
failed=0
for seed in ${SEEDS:-1 2 3}; do
  for model in gpt llama; do
    bazel-bin/tools/train_"$model" --data=data/tinyshakespeare.txt --print_every=100000 \
      --sample_tokens=0 --steps="$steps" --eval_every="$every" --seed="$seed" "$@" \
      >"${dir}/$model.log" 2>&1 || { cat "${dir}/$model.log"; exit 1; }
    sed -n 's/^step \([0-9]*\): val loss \([0-9.]*\)$/\1 \2/p' "${dir}/$model.log" >"${dir}/$model.txt"
  done
  echo "seed $seed: step, GPT val loss, Llama val loss"
  join "${dir}/gpt.txt" "${dir}/llama.txt" | awk '{ printf "  %5d  %.4f  %.4f\n", $1, $2, $3 }'
  last=$(join "${dir}/gpt.txt" "${dir}/llama.txt" | tail -1)
  awk -v l="$last" 'BEGIN { split(l, f, " "); exit !(f[3] <= f[2]) }' || failed=1
done
exit "$failed"
