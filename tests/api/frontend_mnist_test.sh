#!/usr/bin/env bash
# tests/api/ports/frontend_mnist.cc, libtorch's frontend tutorial program ported by the two
# replacements, trains 2 epochs on Debian's Fashion-MNIST (tools/setup.sh installs it; skipped
# without it): the loss falls from epoch 1 to 2 and the test accuracy after epoch 2 is within
# 0.05 of what libtorch's build of the same source reached (0.6897; tests/api/BUILD).
#   $1: the built binary.
set -uo pipefail
source tests/skip.sh
dir=/usr/share/datasets/fashion-mnist
if [ ! -e "$dir/train-images-idx3-ubyte.gz" ]; then
  skip_part "no Fashion-MNIST in $dir (tools/setup.sh installs it)"
  exit 0
fi
out=$("$1" "$dir" 2 2>&1)
status=$?
echo "$out"
if [ "$status" -ne 0 ]; then
  echo "FAIL: frontend_mnist exited ${status}"
  exit 1
fi
read -r loss1 < <(awk '/^epoch 1 /{ print $7 }' <<<"$out")
read -r loss2 accuracy < <(awk '/^epoch 2 /{ print $7, $10 }' <<<"$out")
if ! awk -v a="$loss1" -v b="$loss2" -v acc="$accuracy" \
    'BEGIN { exit !(b < a && acc > 0.6897 - 0.05 && acc < 0.6897 + 0.05) }'; then
  echo "FAIL: loss ${loss1} -> ${loss2}, accuracy ${accuracy} (libtorch: 0.6897)"
  exit 1
fi
echo "PASS"
