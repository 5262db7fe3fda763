#!/usr/bin/env bash
# tests/api/ports/mnist.cc (pytorch/examples cpp/mnist, ported by the replacements of
# port_prelude.h) trains its 10 epochs on the first 2000 training and 1000 test images of
# Debian's Fashion-MNIST, put in ./data as the example expects: every epoch ends with a
# "Test set" line, the test loss falls from the first epoch to the last, and the final accuracy
# is above 0.55 (chance: 0.1). libtorch's MNIST reader takes only the full 60000/10000 files, so
# the comparison with libtorch's build of the same source is on the full data set, in
# docs/api.md (both about 0.85).
#   $1: the built binary.
set -uo pipefail
source tests/skip.sh
source tests/api/make_mnist_subset.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
binary=$(realpath "$1")
make_mnist_subset "$work/data" 2000 1000
made=$?
if [ "$made" -eq 1 ]; then
  skip_part "no Fashion-MNIST in /usr/share/datasets/fashion-mnist (tools/setup.sh installs it)"
  exit 0
fi
[ "$made" -eq 0 ] || { echo "FAIL: could not write the MNIST subset"; exit 1; }
out=$(cd "$work" && "$binary" 2>&1)
status=$?
echo "$out"
[ "$status" -eq 0 ] || { echo "FAIL: mnist exited ${status}"; exit 1; }
lines=$(grep -c '^Test set: Average loss: ' <<<"$out")
first_loss=$(grep '^Test set: ' <<<"$out" | head -n 1 | awk '{ print $5 }')
read -r last_loss accuracy < <(grep '^Test set: ' <<<"$out" | tail -n 1 | awk '{ print $5, $NF }')
if [ "$lines" -ne 10 ] || ! awk -v a="$first_loss" -v b="$last_loss" -v acc="$accuracy" \
    'BEGIN { exit !(b < a && acc > 0.55) }'; then
  echo "FAIL: ${lines} test lines, test loss ${first_loss} -> ${last_loss}, accuracy '${accuracy}'"
  exit 1
fi
echo "PASS"
