#!/usr/bin/env bash
# The main job's time to 90% test accuracy (issue 32, item 4): train_mnist's CNN recipe and the
# same recipe in PyTorch eager (tools/bench/mnist_pytorch.py), SEEDS seeds each, alternating
# between the two so that drift in the machine's speed falls on both. The time of a run is the
# wall time at the end of the first epoch whose test accuracy reaches 90% (evaluations included,
# as both print it); a run that never reaches it counts as missing. Prints every run, the
# medians and their ratio (tapegrad / PyTorch; issue 32's target is 0.8 at most).
#
#   tools/bench/time_to_accuracy.sh                 # seeds 0 1 2, OMP_NUM_THREADS=2
#   SEEDS="0 1 2 3 4" THREADS=1 tools/bench/time_to_accuracy.sh
#
# Needs /usr/share/datasets/fashion-mnist (tools/setup.sh) and torch for the PyTorch side (the
# system python3, or the venv of setup_pytorch_venv.sh in PYTHON). Extra flags for bazel go in
# BAZEL_FLAGS (e.g. --config=cpu).
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel build ${BAZEL_FLAGS:-} //tools:train_mnist >&2
py="${PYTHON:-python3}"
threads="${THREADS:-2}"
seeds="${SEEDS:-0 1 2}"
echo "$(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, OMP_NUM_THREADS=${threads}, seeds ${seeds}"

# first_at_90 LOG: the time of the first "epoch N: ... test accuracy A% at T s" line with A >= 90.
first_at_90() {
  sed -n 's/^epoch [0-9]*: test loss [0-9.]*, test accuracy \([0-9.]*\)% at \([0-9.]*\) s.*/\1 \2/p' "$1" |
    awk '$1 >= 90 { print $2; found = 1; exit } END { if (!found) print "none" }'
}

ours=() theirs=()
for seed in ${seeds}; do
  OMP_NUM_THREADS="${threads}" bazel-bin/tools/train_mnist --seed="${seed}" >/tmp/tta_ours.log 2>&1
  a="$(first_at_90 /tmp/tta_ours.log)"
  OMP_NUM_THREADS="${threads}" "${py}" tools/bench/mnist_pytorch.py --seed "${seed}" >/tmp/tta_torch.log 2>&1
  b="$(first_at_90 /tmp/tta_torch.log)"
  echo "seed ${seed}: tapegrad ${a} s, PyTorch ${b} s"
  [ "${a}" = none ] || ours+=("${a}")
  [ "${b}" = none ] || theirs+=("${b}")
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print NR ? v[int((NR + 1) / 2)] : "none" }'; }
m_ours="$(median "${ours[@]+"${ours[@]}"}")"
m_theirs="$(median "${theirs[@]+"${theirs[@]}"}")"
echo "median time to 90%: tapegrad ${m_ours} s (${#ours[@]} runs reached it), PyTorch ${m_theirs} s (${#theirs[@]})"
if [ "${m_ours}" != none ] && [ "${m_theirs}" != none ]; then
  awk -v a="${m_ours}" -v b="${m_theirs}" 'BEGIN { printf "ratio %.2f\n", a / b }'
fi
