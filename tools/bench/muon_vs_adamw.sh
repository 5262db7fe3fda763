#!/usr/bin/env bash
# Muon against AdamW on the tiny Shakespeare GPT (issue 43's target): for each seed, train_gpt
# with AdamW for STEPS steps sets the target validation loss; then --optimizer=muon (Muon for
# the hidden matrices, AdamW with the same --lr for the embeddings, norms and biases) runs with
# whole schedules of 0.5, 0.6, 0.7 and 0.8 x STEPS steps. Prints each run's final validation loss
# and the fewest steps at which Muon reached the target; exits 1 when Muon at 0.8 x STEPS misses
# it for any seed.
#
#   tools/bench/muon_vs_adamw.sh [train_gpt flags...]     (e.g. --muon_lr=0.03)
#
# STEPS (default 1500, train_gpt's default run) and SEEDS (default "1 2 3") from the environment;
# extra flags for bazel in BAZEL_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel build -c opt ${BAZEL_FLAGS:-} //tools:train_gpt >&2
steps="${STEPS:-1500}"
log="$(mktemp)"
trap 'rm -f "${log}"' EXIT
final_val() { sed -n 's/^val loss \([0-9.]*\) after.*/\1/p' "${log}"; }
run() {  # steps seed optimizer flags...
  local n="$1" seed="$2" opt="$3"
  shift 3
  bazel-bin/tools/train_gpt --data=data/tinyshakespeare.txt --print_every=100000 \
    --sample_tokens=0 --steps="$n" --eval_every="$n" --warmup_steps=$((n / 10)) --seed="$seed" \
    --optimizer="$opt" "$@" >"${log}" 2>&1 || { cat "${log}"; exit 1; }
  final_val
}
failed=0
for seed in ${SEEDS:-1 2 3}; do
  target=$(run "$steps" "$seed" adamw "$@")
  echo "seed $seed: AdamW $steps steps: val loss $target"
  reached=""
  for fraction in 0.5 0.6 0.7 0.8; do
    n=$(awk -v s="$steps" -v f="$fraction" 'BEGIN { printf "%d", s * f }')
    val=$(run "$n" "$seed" muon "$@")
    ok=$(awk -v v="$val" -v t="$target" 'BEGIN { print (v <= t) ? "yes" : "no" }')
    echo "seed $seed: Muon $n steps ($fraction x): val loss $val ($ok)"
    if [ "$ok" = yes ] && [ -z "$reached" ]; then reached="$fraction"; fi
    if [ "$fraction" = 0.8 ] && [ "$ok" = no ]; then failed=1; fi
  done
  echo "seed $seed: Muon reached AdamW's $steps-step loss at ${reached:-more than 0.8} x the steps"
done
exit "$failed"
