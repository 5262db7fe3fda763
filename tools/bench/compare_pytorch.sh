#!/usr/bin/env bash
# tapegrad's training steps next to PyTorch's fastest variant on this machine: for each round and
# thread count, PyTorch's run (tools/bench/train_step_pytorch.py) then tapegrad's (train_step),
# interleaved, and at the end the median ratio per row over the rounds (tools/bench/
# pair_summary.py). Benchmarks only; needs the venv that setup_pytorch_venv.sh makes (it makes it
# when missing).
#
#   tools/bench/compare_pytorch.sh [THREADS...]     (default: 1 2)
#
# ROUNDS=N (default 3) repeats the thread counts N times. Every timing, PyTorch's and ours, is
# bracketed by the cache-line round trip between two CPUs (tools/bench/core_latency.h): a VM's
# host moves its vCPUs, and 2-thread steps are slower while they sit far apart (on the 2-vCPU EPYC
# of 2026-11-29, 64-90 ns near, 350-410 ns far, for seconds to minutes at a time; PyTorch's
# 2-thread MLP step 1.95 -> 3.2 ms far, ours 1.27 -> 1.75 ms). A round whose two sides were timed
# in different placements is printed "(phases differ)" and left out of the medians, which are
# also given per placement.
#
# PyTorch variants go in PYTORCH_VARIANTS (train_step_pytorch.py --variants; default
# eager,composed,compile): eager as written (the GPT's attention through SDPA), composed (the GPT's
# attention from plain ops) and compile (torch.compile of the model; compilation is not timed but
# takes a while: PYTORCH_VARIANTS=eager,composed skips it). Each row's ratio is against the
# fastest variant run, named on the row.
# Extra flags for train_step go in TRAIN_STEP_FLAGS (e.g. --steps=20), for
# train_step_pytorch.py in PYTORCH_FLAGS (e.g. "--models mlp,gpt --dtypes f32"), for bazel in
# BAZEL_FLAGS (e.g. --config=cpu). PAUSE=S sleeps S seconds before each measurement. ROWS=FILE
# appends the rows' JSON lines to FILE and keeps it (tools/bench/pair_summary.py FILE).
set -euo pipefail
cd "$(dirname "$0")/../.."
py="$(tools/bench/setup_pytorch_venv.sh | tail -1)"
bazel build -c opt ${BAZEL_FLAGS:-} //tools/bench:train_step //tools/bench:core_round_trip >&2
json="$(mktemp --suffix=.jsonl)"
if [[ -n "${ROWS:-}" ]]; then
  rows="${ROWS}"  # kept: the rows of several runs can be summarised together
  trap 'rm -f "${json}"' EXIT
else
  rows="$(mktemp --suffix=.jsonl)"
  trap 'rm -f "${json}" "${rows}"' EXIT
fi
threads=("$@")
[[ ${#threads[@]} -gt 0 ]] || threads=(1 2)
rounds="${ROUNDS:-3}"
[[ "${rounds}" =~ ^[1-9][0-9]*$ ]] || { echo "compare_pytorch.sh: ROUNDS=${rounds} is not a positive count" >&2; exit 2; }
for ((round = 1; round <= rounds; ++round)); do
  for n in "${threads[@]}"; do
    echo "== round ${round} of ${rounds}, ${n} thread(s), $(date -u +%H:%M:%S) UTC"
    sleep "${PAUSE:-0}"
    "${py}" tools/bench/train_step_pytorch.py --threads "${n}" \
      --variants "${PYTORCH_VARIANTS:-eager,composed,compile}" \
      --core-probe bazel-bin/tools/bench/core_round_trip ${PYTORCH_FLAGS:-} --out "${json}" >/dev/null
    sleep "${PAUSE:-0}"
    OMP_NUM_THREADS="${n}" bazel-bin/tools/bench/train_step --pytorch_json="${json}" \
      --json_out="${rows}" ${TRAIN_STEP_FLAGS:-}
  done
done
echo
echo "== medians of the rounds (ratio tapegrad / PyTorch's fastest; below 1: tapegrad faster)"
"${py}" tools/bench/pair_summary.py "${rows}"
