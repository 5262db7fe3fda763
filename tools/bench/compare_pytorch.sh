#!/usr/bin/env bash
# tapegrad's training steps next to PyTorch's fastest variant on this machine: for each thread
# count, PyTorch's run (tools/bench/train_step_pytorch.py) then tapegrad's (train_step),
# interleaved, so that drift in the machine's speed falls on both. Benchmarks only; needs the venv
# that setup_pytorch_venv.sh makes (it makes it when missing).
#
#   tools/bench/compare_pytorch.sh [THREADS...]     (default: 1 2)
#
# PyTorch variants go in PYTORCH_VARIANTS (train_step_pytorch.py --variants; default
# eager,composed,compile): eager as written (the GPT's attention through SDPA), composed (the GPT's
# attention from plain ops) and compile (torch.compile of the model; compilation is not timed but
# takes a while: PYTORCH_VARIANTS=eager,composed skips it). Each row's ratio is against the
# fastest variant run, named on the row.
# Extra flags for train_step go in TRAIN_STEP_FLAGS (e.g. --steps=20), for bazel in BAZEL_FLAGS
# (e.g. --config=cpu). PAUSE=S sleeps S seconds before each measurement, for machines whose speed
# drops under sustained load (a VM with a burst budget); on the 2-vCPU EPYC of 2026-11-28 it did
# not change the 2-thread spread, which came in phases of the VM's own (docs/performance.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
py="$(tools/bench/setup_pytorch_venv.sh | tail -1)"
bazel build -c opt ${BAZEL_FLAGS:-} //tools/bench:train_step >&2
json="$(mktemp --suffix=.jsonl)"
trap 'rm -f "${json}"' EXIT
threads=("$@")
[[ ${#threads[@]} -gt 0 ]] || threads=(1 2)
for n in "${threads[@]}"; do
  sleep "${PAUSE:-0}"
  "${py}" tools/bench/train_step_pytorch.py --threads "${n}" \
    --variants "${PYTORCH_VARIANTS:-eager,composed,compile}" --out "${json}" >/dev/null
  sleep "${PAUSE:-0}"
  OMP_NUM_THREADS="${n}" bazel-bin/tools/bench/train_step --pytorch_json="${json}" \
    ${TRAIN_STEP_FLAGS:-}
done
