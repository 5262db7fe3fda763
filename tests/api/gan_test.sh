#!/usr/bin/env bash
# tests/api/ports/gan.cc (a small DCGAN written for libtorch: ConvTranspose2d, BatchNorm2d,
# Sequential, Adam, save/load) trains 1000 steps: the generated images' mean pixel is within 0.2
# and their share of bright pixels within 0.1 of the real images' (an untrained generator gives
# about 0 and 0.5), as libtorch's build of the source reached (tests/api/BUILD), and a generator,
# discriminator and optimizers loaded from tg::save files take the next step to exactly the
# originals' parameters.
#   $1: the built binary.
set -uo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=$("$1" 1000 "$work" 2>&1)
status=$?
echo "$out"
[ "$status" -eq 0 ] || { echo "FAIL: gan exited ${status}"; exit 1; }
read -r fake_mean real_mean fake_bright real_bright < <(awk '/^fake_mean /{ print $2, $4, $6, $8 }' <<<"$out")
if ! awk -v fm="$fake_mean" -v rm="$real_mean" -v fb="$fake_bright" -v rb="$real_bright" \
    'BEGIN { d = fm - rm; e = fb - rb; exit !(fm != "" && d < 0.2 && d > -0.2 && e < 0.1 && e > -0.1) }'; then
  echo "FAIL: generated mean ${fake_mean} / bright ${fake_bright} vs real ${real_mean} / ${real_bright}"
  exit 1
fi
grep -q '^resumed step identical: yes$' <<<"$out" || { echo "FAIL: the resumed step differs"; exit 1; }
for f in g.ckpt g_opt.ckpt d.ckpt d_opt.ckpt; do
  [ -s "$work/$f" ] || { echo "FAIL: no checkpoint $f"; exit 1; }
done
echo "PASS"
