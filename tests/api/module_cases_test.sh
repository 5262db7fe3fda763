#!/usr/bin/env bash
# tests/api/ports/module_cases.cc built against tapegrad prints what libtorch 2.15's build of the
# same source printed (testdata/module_cases_libtorch.txt): the same lines in the same order,
# the same words, and every number within 1e-5 relative (+ 1e-6 absolute) of libtorch's. The
# cases are computed in f32 by both libraries, in their own orders of summation.
#   $1: the built binary; $2: libtorch's output.
set -uo pipefail
out=$("$1" 2>&1)
status=$?
[ "$status" -eq 0 ] || { echo "$out"; echo "FAIL: module_cases exited ${status}"; exit 1; }
if ! awk -v rtol=1e-5 -v atol=1e-6 '
    NR == FNR { want[++n] = $0; next }
    { got[++m] = $0 }
    END {
      bad = 0
      if (n != m) { print "line count: libtorch " n ", tapegrad " m; bad = 1 }
      for (i = 1; i <= n && i <= m; ++i) {
        k = split(want[i], w, " "); l = split(got[i], g, " ")
        if (k != l || w[1] != g[1]) { print "line " i ": want \"" want[i] "\"\n  got \"" got[i] "\""; bad = 1; continue }
        for (j = 2; j <= k; ++j) {
          if (w[j] ~ /^-?[0-9.]+(e[-+]?[0-9]+)?$/ && g[j] ~ /^-?[0-9.]+(e[-+]?[0-9]+)?$/) {
            d = w[j] - g[j]; if (d < 0) d = -d
            s = w[j] < 0 ? -w[j] : w[j]
            if (d > atol + rtol * s) { print w[1] " value " j - 1 ": libtorch " w[j] ", tapegrad " g[j]; bad = 1 }
          } else if (w[j] != g[j]) { print w[1] " word " j - 1 ": libtorch " w[j] ", tapegrad " g[j]; bad = 1 }
        }
      }
      exit bad
    }' "$2" - <<<"$out"; then
  echo "FAIL: tapegrad's module_cases differ from libtorch's (above)"
  exit 1
fi
echo "PASS: $(wc -l < "$2") lines as libtorch printed them"
