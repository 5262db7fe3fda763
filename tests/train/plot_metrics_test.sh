#!/usr/bin/env bash
# plot_metrics.sh writes a non-empty PNG for a metrics CSV (fixed column order, shuffled column
# order with an extra val_loss column, no loss_scale column) and fails cleanly on bad input.
set -uo pipefail

script=tools/plot_metrics.sh  # relative to the runfiles root, where Bazel runs the test
source tests/skip.sh
tmp=${TEST_TMPDIR:-$(mktemp -d)}
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# Without gnuplot nothing here can run: the target counts as skipped (tests/skip.sh), not passed.
if ! command -v gnuplot >/dev/null 2>&1; then
  skip_part "gnuplot is not installed (tools/setup.sh installs gnuplot-nox)"
  exit 0
fi

# Usage errors need no gnuplot output.
bash "$script" >/dev/null 2>&1
[ $? -eq 2 ] || fail "no arguments should exit 2"
bash "$script" "$tmp/missing.csv" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] || fail "a missing file should exit 1"
grep -q "missing.csv" "$tmp/err" || fail "the error should name the missing file"
printf 'a,b\n1,2\n' >"$tmp/no_loss.csv"
bash "$script" "$tmp/no_loss.csv" >/dev/null 2>&1
[ $? -eq 1 ] || fail "a CSV without step/loss columns should exit 1"

# Checks that $1 exists, is non-empty and starts with the 8 PNG magic bytes.
check_png() {
  if [ ! -s "$1" ]; then
    fail "$1 missing or empty"
    return
  fi
  local magic
  magic=$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')
  [ "$magic" = "89504e470d0a1a0a" ] || fail "$1 does not start with the PNG signature ($magic)"
}

header="step,epoch,loss,lr,grad_norm,loss_scale,loss_scale_next,skipped_steps,items_per_s,elapsed_s"
{
  echo "$header"
  echo "1,0.25,2.5,0.001,nan,65536,32768,1,1234.5,0.25"
  echo "2,0.5,2.25,0.001,0.75,32768,32768,1,1234.5,0.5"
  echo "3,0.75,2,0.001,0.5,32768,65536,1,1234.5,0.75"
  echo "4,1,1.75,0.001,0.5,65536,65536,1,1234.5,1"
} >"$tmp/metrics.csv"
bash "$script" "$tmp/metrics.csv" || fail "plot of metrics.csv failed"
check_png "$tmp/metrics.png"  # default output name

{
  echo "loss_scale,val_loss,loss,step"
  echo "65536,,2.5,1"
  echo "32768,2.4,2.25,2"
  echo "32768,,2,3"
  echo "65536,1.9,1.75,4"
} >"$tmp/shuffled.csv"
bash "$script" --log-loss "$tmp/shuffled.csv" "$tmp/shuffled out.png" ||
  fail "plot of shuffled.csv failed"
check_png "$tmp/shuffled out.png"

printf 'step,loss\n1,2.5\n2,2.25\n' >"$tmp/no_scale.csv"
bash "$script" "$tmp/no_scale.csv" "$tmp/no_scale.png" || fail "plot of no_scale.csv failed"
check_png "$tmp/no_scale.png"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "PASS"
