#!/usr/bin/env bash
# bazel run //tools:semantics_diff -- SCENARIO.json: runs one scenario (a JSON object in a file,
# any layout, in the format of tools/semantics/README.md) in tapegrad and, when PyTorch is
# installed (the venv of tools/bench/setup_pytorch_venv.sh, or python3's own torch), in PyTorch;
# prints both event sequences side by side and the first difference.
set -uo pipefail
runner=$1
scenario=$2
[ -n "${BUILD_WORKING_DIRECTORY:-}" ] && [[ "$scenario" != /* ]] && scenario="$BUILD_WORKING_DIRECTORY/$scenario"
here=$(dirname "$(realpath "$0")")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); s.setdefault("id", 0); print(json.dumps(s))' \
  "$scenario" > "$work/one.jsonl" || { echo "semantics_diff: $scenario is not a JSON object"; exit 1; }
"$runner" "$work/one.jsonl" > "$work/tapegrad.txt" || exit 1
py=""
for candidate in "$HOME/.cache/tapegrad/torch-venv/bin/python" python3; do
  if "$candidate" -c 'import torch' 2>/dev/null; then py=$candidate; break; fi
done
if [ -z "$py" ]; then
  echo "PyTorch is not installed (tools/bench/setup_pytorch_venv.sh makes a venv); tapegrad's events:"
  cat "$work/tapegrad.txt"
  exit 0
fi
"$py" "$here/run_pytorch.py" "$work/one.jsonl" > "$work/pytorch.txt" || exit 1
printf '%-60s | %s\n' "PyTorch" "tapegrad"
paste -d'|' <(cut -c1-60 "$work/pytorch.txt" | awk '{ printf "%-60s\n", $0 }') "$work/tapegrad.txt"
echo
bash "$here/compare.sh" "$work/pytorch.txt" "$work/tapegrad.txt"
