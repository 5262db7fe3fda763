#!/usr/bin/env bash
# Runs the committed oracle scenarios in tapegrad and compares each one's events with what
# PyTorch printed for it (tools/semantics/regenerate.sh made the goldens): 100% must match.
#   $1: the runner; $2: compare.sh; $3: the scenarios; $4: PyTorch's events.
set -uo pipefail
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$1" "$3" > "$out" || { echo "FAIL: the runner exited $?"; exit 1; }
bash "$2" "$4" "$out"
