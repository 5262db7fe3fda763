#!/usr/bin/env bash
# The README's "Training from C++" example: its code block is tools/readme_example.cc below the
# file's leading comment, line for line; the binary built from it runs, prints the loss at steps
# 10..50, and the loss at step 50 is below a tenth of the loss at step 10 (it learns 64 labels by
# heart; a broken optimizer, autocast or backward leaves it near ln(10)).
#   $1: README.md, $2: tools/readme_example.cc, $3: the built binary.
set -uo pipefail
readme=$1 source=$2 binary=$3

block=$(awk '/^## Training from C\+\+/ { f = 1 } f && /^```cpp/ { p = 1; next } p && /^```/ { exit } p' \
  "$readme")
code=$(awk 'started || !/^\/\// { if (!started && $0 == "") { started = 1; next } started = 1; print }' \
  "$source")
if [ -z "$block" ]; then
  echo "FAIL: README.md has no \`\`\`cpp block under '## Training from C++'"
  exit 1
fi
if [ "$block" != "$code" ]; then
  echo "FAIL: README.md's C++ example differs from tools/readme_example.cc:"
  diff <(echo "$block") <(echo "$code")
  exit 1
fi

out=$("$binary" 2>&1)
status=$?
echo "$out"
if [ "$status" -ne 0 ]; then
  echo "FAIL: readme_example exited ${status}"
  exit 1
fi
first=$(awk '$1 == "step" && $2 == 10 { print $4 }' <<<"$out")
last=$(awk '$1 == "step" && $2 == 50 { print $4 }' <<<"$out")
if [ -z "$first" ] || [ -z "$last" ]; then
  echo "FAIL: expected lines 'step 10 loss X' and 'step 50 loss Y'"
  exit 1
fi
if ! awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a / 10) }'; then
  echo "FAIL: loss ${first} at step 10, ${last} at step 50: not below a tenth"
  exit 1
fi
echo "PASS: the README's example builds and its loss falls from ${first} to ${last}"
