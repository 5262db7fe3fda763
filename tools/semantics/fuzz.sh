#!/usr/bin/env bash
# tools/semantics/fuzz.sh SECONDS [FIRST_SEED]: the oracle's fuzzing run. Generates batches of
# 2000 scenarios from FIRST_SEED on (default: 1,000,000, past the committed seeds), runs them in
# PyTorch (the venv of tools/bench/setup_pytorch_venv.sh) and in tapegrad, and appends every
# scenario that differs to tools/semantics/found.jsonl, until SECONDS have passed. Build the
# runner first (bazel build //tools/semantics:runner). A found scenario, once understood (fixed,
# or named in docs/semantics.md), joins tests/semantics/testdata/reproducers.jsonl (then run
# tools/semantics/regenerate.sh). RUNNER=path runs another copy of the runner, so that builds
# made meanwhile (which replace bazel-bin's) do not change it under the run.
set -uo pipefail
cd "$(dirname "$0")/../.."
seconds=$1
seed=${2:-1000000}
py=$(bash tools/bench/setup_pytorch_venv.sh | tail -n 1)
runner=${RUNNER:-bazel-bin/tools/semantics/runner}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
end=$((SECONDS + seconds))
total=0 found=0
while [ "$SECONDS" -lt "$end" ]; do
  python3 tools/semantics/generate.py "$seed" 2000 > "$work/s.jsonl"
  "$py" tools/semantics/run_pytorch.py "$work/s.jsonl" > "$work/p.txt"
  "$runner" "$work/s.jsonl" > "$work/t.txt" 2>/dev/null
  bash tools/semantics/compare.sh "$work/p.txt" "$work/t.txt" > "$work/c.txt"
  for id in $(awk '/^scenario [0-9]+:/{ sub(":", "", $2); print $2 }' "$work/c.txt"); do
    sed -n "$((id - seed + 1))p" "$work/s.jsonl" >> tools/semantics/found.jsonl
    found=$((found + 1))
  done
  total=$((total + 2000))
  seed=$((seed + 2000))
done
echo "fuzz: ${total} scenarios, ${found} differing (tools/semantics/found.jsonl), next seed ${seed}"
