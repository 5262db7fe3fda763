#!/usr/bin/env bash
# tools/check_names.sh [ROOT]: the file and symbol names that comments and docs give point at
# things that exist, in the git work tree ROOT (default: this repository; tools/test.sh runs it
# and counts it as one test). Prints each stale name with where it is written, and exits 1 if
# there is one.
#
# - Files: every path of the repository's own directories (amp/..., tensor/cpu/..., docs/...,
#   with a source, doc or data extension) in a tracked text file must be a file or directory of
#   the tree. A path of another project (torch/nn/modules/module.py) is one whose first
#   directory follows a '/', and is not read as ours.
# - Symbols: every Qualified::name written in backticks in a doc, or in a comment of the code,
#   must have both its names somewhere in the code outside comments.
# Names that are meant not to exist (generated outputs, other projects' symbols) are listed below
# with why; the checks' own tests (tests/tools/check_*_test.sh), whose fixtures name missing
# things on purpose, are not read.
set -uo pipefail
cd "${1:-$(dirname "$0")/..}" || exit 1

# Written on purpose though absent: "path-or-name  why".
allowed=(
  "tools/semantics/found.jsonl"          # written by tools/semantics/fuzz.sh when it finds one
  "data/tinyshakespeare/input.txt"       # the text's path in its upstream repository
  "CommandLineFlag::IsSpecifiedOnCommandLine"  # absl's
  "CreationMeta::MULTI_OUTPUT_NODE"      # PyTorch's view creation kinds
  "CreationMeta::NO_GRAD_MODE"
  "VariableHooks::grad_fn"               # PyTorch's
)
is_allowed() {
  local x
  for x in "${allowed[@]}"; do [ "$x" = "$1" ] && return 0; done
  return 1
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git ls-files > "$work/tracked"
grep -vE '\.(png|bin|safetensors|jsonl|txt|csv|idx)$' "$work/tracked" |
  grep -vE '^tests/tools/check_[a-z_]+_test\.sh$' > "$work/text"
grep -E '\.(h|cc|cu|cuh|inc)$' "$work/tracked" > "$work/code"
bad=0

# ---- Files.
dirs='amp|autograd|dataset|distributed|nn|optim|tensor|tools|train|tests|docs|data|third_party'
exts='h|cc|cu|cuh|inc|md|sh|py|bzl|json|jsonl|txt|png'
xargs -d '\n' grep -oHP "(?<![\\w/.~\$-])(${dirs})/[A-Za-z0-9_/.-]*[A-Za-z0-9_]\\.(${exts})\\b" \
  < "$work/text" 2>/dev/null | sort -u > "$work/paths"
while IFS=: read -r where path; do
  [ -e "$path" ] && continue
  is_allowed "$path" && continue
  echo "check_names: $where names $path, which does not exist"
  bad=1
done < "$work/paths"

# ---- Symbols.
xargs -d '\n' cat < "$work/code" | grep -v '^\s*//' | grep -oP '\b[A-Za-z_][A-Za-z0-9_]*\b' |
  sort -u > "$work/identifiers"
{
  grep -E '\.md$' "$work/text" | xargs -d '\n' grep -oHP '`[^`]*`' 2>/dev/null
  xargs -d '\n' grep -HP '^\s*//' < "$work/code" 2>/dev/null
} | grep -oP '^[^:]+:|\b[A-Z][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*' |
  awk '/:$/ { file = substr($0, 1, length($0) - 1); next } { print file "\t" $0 }' |
  sort -u > "$work/symbols"
while IFS=$'\t' read -r where symbol; do
  is_allowed "$symbol" && continue
  for part in "${symbol%%::*}" "${symbol##*::}"; do
    if ! grep -qx "$part" "$work/identifiers"; then
      echo "check_names: $where names $symbol, but no code defines or uses $part"
      bad=1
      break
    fi
  done
done < "$work/symbols"

if [ "$bad" -ne 0 ]; then exit 1; fi
echo "check_names: OK ($(wc -l < "$work/paths") file names, $(wc -l < "$work/symbols") qualified names)"
