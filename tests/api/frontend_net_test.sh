#!/usr/bin/env bash
# tests/api/ports/frontend_net.cc, libtorch's frontend tutorial network ported by the two
# replacements, built against tapegrad: it runs, prints its 7 evaluation lines, and learns the
# 64 random labels by heart as the libtorch build does (its run, 2026-12-02, libtorch 2.15:
# loss 2.2864 at step 1, 0.0002 at step 300, accuracy 1.000 from step 50 on): the loss at step
# 300 is below a hundredth of step 1's, and the accuracy at step 300 is 1.000.
#   $1: the built binary.
set -uo pipefail
out=$("$1" 2>&1)
status=$?
echo "$out"
if [ "$status" -ne 0 ]; then
  echo "FAIL: frontend_net exited ${status}"
  exit 1
fi
lines=$(grep -c '^step [0-9]* eval loss [0-9.]* accuracy [0-9.]*$' <<<"$out")
if [ "$lines" -ne 7 ]; then
  echo "FAIL: expected 7 lines 'step N eval loss L accuracy A', got ${lines}"
  exit 1
fi
first=$(awk '/^step 1 /{ print $5 }' <<<"$out")
last=$(awk '/^step 300 /{ print $5 }' <<<"$out")
accuracy=$(awk '/^step 300 /{ print $7 }' <<<"$out")
if ! awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 1.5 && b < a / 100) }'; then
  echo "FAIL: the loss did not fall from ${first} to below a hundredth of it (${last})"
  exit 1
fi
if [ "$accuracy" != "1.000" ]; then
  echo "FAIL: accuracy at step 300 is ${accuracy}, expected 1.000"
  exit 1
fi
echo "PASS"
