#!/usr/bin/env bash
# tests/api/ports/gan.cc (a small DCGAN written for libtorch: ConvTranspose2d, BatchNorm2d,
# Sequential, Adam, save/load) trains 1000 steps: the generated images' share of bright pixels is
# within 0.1 and their mean pixel within 0.4 of the real images' (an untrained generator gives
# about 0.5 and 0: 0.375 and 0.75 off), as libtorch's build of the source reached (tests/api/BUILD),
# and a generator, discriminator and optimizers loaded from tg::save files take the next step to
# exactly the originals' parameters. The bounds cover the spread of a GAN at 1000 steps: over
# seeds 0-7 (`gan 1000 DIR SEED`, 2026-12-07, an AVX2-only AMD EPYC) the bright share was
# 0.017-0.031 off and the mean 0.11-0.32 off; the mean is the noisier statistic (the generator's
# background settles slowly), and which value a seed gets depends on the CPU's kernels, since
# their roundings differ by instruction set and a GAN amplifies them.
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
    'BEGIN { d = fm - rm; e = fb - rb; exit !(fm != "" && d < 0.4 && d > -0.4 && e < 0.1 && e > -0.1) }'; then
  echo "FAIL: generated mean ${fake_mean} / bright ${fake_bright} vs real ${real_mean} / ${real_bright}"
  exit 1
fi
grep -q '^resumed step identical: yes$' <<<"$out" || { echo "FAIL: the resumed step differs"; exit 1; }
for f in g.ckpt g_opt.ckpt d.ckpt d_opt.ckpt; do
  [ -s "$work/$f" ] || { echo "FAIL: no checkpoint $f"; exit 1; }
done
echo "PASS"
