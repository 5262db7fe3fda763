#!/usr/bin/env bash
# compare.sh WANT GOT: the oracle's comparison of two event files (tools/semantics/README.md).
# Every line must match word for word, except that numbers match within 1e-12 (absolute, plus
# 1e-12 relative: the libraries' f64 tanh/exp differ in the last bit, and an ill-conditioned
# gradient such as 1 - tanh(x)^2 at a large x turns that into a relative 1e-9 of a tiny value)
# and "#" comment lines (error texts) are skipped on both sides. Prints each scenario that
# differs with its first differing line, the count of scenarios that match, and exits 1 if any
# differs.
set -uo pipefail
awk -v rtol=1e-12 -v atol=1e-12 '
  function num(x) { return x ~ /^-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$/ || x == "nan" || x == "-nan" || x == "inf" || x == "-inf" }
  function same(a, b,    k, l, w, g, j, d, s) {
    k = split(a, w, " "); l = split(b, g, " ")
    if (k != l) return 0
    for (j = 1; j <= k; ++j) {
      if (w[j] == g[j]) continue
      if (!num(w[j]) || !num(g[j])) return 0
      d = w[j] - g[j]; if (d < 0) d = -d
      s = w[j] < 0 ? -w[j] : w[j]
      if (d > atol + rtol * s) return 0
    }
    return 1
  }
  FNR == 1 { file++ }
  /^#( |$)/ { next }
  /^### scenario / { id = $3; if (file == 1) order[++n] = id; next }
  { if (file == 1) want[id] = want[id] "\n" $0; else got[id] = got[id] "\n" $0 }
  END {
    bad = 0; ok = 0
    for (i = 1; i <= n; ++i) {
      id = order[i]
      a = want[id]; b = got[id]
      if (a == b) { ok++; continue }
      na = split(a, x, "\n"); nb = split(b, y, "\n")
      diff = 0
      for (j = 2; j <= (na > nb ? na : nb); ++j) {
        if (j > na || j > nb || !same(x[j], y[j])) { diff = j; break }
      }
      if (!diff) { ok++; continue }
      bad++
      if (bad <= 20) {
        print "scenario " id ": line " diff - 1 ": want \"" (diff <= na ? x[diff] : "(nothing)") "\""
        print "  got  \"" (diff <= nb ? y[diff] : "(nothing)") "\""
      }
    }
    print ok " of " n " scenarios match"
    exit bad > 0
  }' "$1" "$2"
