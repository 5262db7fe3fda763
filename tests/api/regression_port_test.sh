#!/usr/bin/env bash
# tests/api/ports/regression.cc (pytorch/examples cpp/regression, ported by the replacements of
# port_prelude.h) runs to its stop criterion: it prints the final loss (below 1e-3) and the
# learned and actual polynomials, whose coefficients agree to 0.25 (the criterion is one batch's
# loss, so the fit is close, not exact; the targets are drawn from N(0, 25)).
#   $1: the built binary.
set -uo pipefail
out=$("$1" 2>&1)
status=$?
echo "$out"
[ "$status" -eq 0 ] || { echo "FAIL: regression exited ${status}"; exit 1; }
loss=$(awk '/^Loss: /{ print $2 }' <<<"$out")
learned=$(awk -F'\t' '/Learned function/{ print $2 }' <<<"$out")
actual=$(awk -F'\t' '/Actual function/{ print $2 }' <<<"$out")
# "y = a x^4 b x^3 c x^2 d x^1 + e": the numbers are fields 3, 5, 7, 9 and 12.
if ! awk -v loss="$loss" -v l="$learned" -v a="$actual" 'BEGIN {
    n = split(l, x, " "); m = split(a, y, " ")
    if (n != 12 || m != 12 || loss == "" || loss >= 1e-3) exit 1
    split("3 5 7 9 12", idx, " ")
    for (i = 1; i <= 5; ++i) { d = x[idx[i]] - y[idx[i]]; if (d > 0.25 || d < -0.25) exit 1 }
  }'; then
  echo "FAIL: loss '${loss}', learned '${learned}' vs actual '${actual}'"
  exit 1
fi
echo "PASS"
