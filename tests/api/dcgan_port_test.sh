#!/usr/bin/env bash
# tests/api/ports/dcgan.cc (pytorch/examples cpp/dcgan, ported by the replacements of
# port_prelude.h) trains one epoch on the first 640 images of Debian's Fashion-MNIST in ./data
# (10 batches of 64): it logs batch 10 with finite discriminator and generator losses in the
# example's format and completes.
#   $1: the built binary.
set -uo pipefail
source tests/skip.sh
source tests/api/make_mnist_subset.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
binary=$(realpath "$1")
make_mnist_subset "$work/data" 640 10
made=$?
if [ "$made" -eq 1 ]; then
  skip_part "no Fashion-MNIST in /usr/share/datasets/fashion-mnist (tools/setup.sh installs it)"
  exit 0
fi
[ "$made" -eq 0 ] || { echo "FAIL: could not write the MNIST subset"; exit 1; }
out=$(cd "$work" && "$binary" --epochs 1 2>&1)
status=$?
echo "$out"
[ "$status" -eq 0 ] || { echo "FAIL: dcgan exited ${status}"; exit 1; }
line=$(grep -a -E '\[ 1/ 1\]\[ 10/ 10\] D_loss: [0-9.]+ \| G_loss: [0-9.]+$' <<<"$out")
if [ -z "$line" ] || ! grep -q '^Training complete!$' <<<"$out"; then
  echo "FAIL: no finite loss line for batch 10, or no 'Training complete!'"
  exit 1
fi
echo "PASS"
