#!/usr/bin/env bash
# Regenerates the oracle's committed goldens (tools/semantics/README.md): the scenarios of seeds
# 0..1999 followed by the fuzzing reproducers (tests/semantics/testdata/reproducers.jsonl, one
# scenario per line, kept as found), and PyTorch's events for them, printed by the PyTorch of the venv that
# tools/bench/setup_pytorch_venv.sh makes. The build and the tests never need PyTorch.
#
#   tools/semantics/regenerate.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
py=$(bash tools/bench/setup_pytorch_venv.sh | tail -n 1)
out=tests/semantics/testdata
{ python3 tools/semantics/generate.py 0 2000; cat "$out/reproducers.jsonl"; } > "$out/scenarios.jsonl"
"$py" tools/semantics/run_pytorch.py "$out/scenarios.jsonl" > "$out/pytorch_events.txt"
echo "torch $("$py" -c 'import torch; print(torch.__version__)'): $(grep -c '^### scenario' "$out/pytorch_events.txt") scenarios"
