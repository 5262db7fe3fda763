#!/usr/bin/env bash
# The layering check of the test command (tools/test.sh runs it): every dependency between two
# targets of this workspace must point down the package order of docs/architecture.md, read from
# the BUILD files with `bazel query`. Prints each violation as "//from:target -> //to:target
# (from_package above/below to_package)" and exits 1 if there is any, 0 otherwise.
#
#   tools/check_layering.sh     # "layering: OK (N dependencies between packages checked)"
#
# The order, bottom to top; a target may depend on targets of its own floor or of floors below:
#   data < tools/bazel < tensor < autograd < optim < amp < nn < dataset < distributed < train < tools < tests
# optim is below amp, since amp's MixedPrecisionOptimizer wraps an optim::Optimizer (and uses
# optim's clipping), while optim needs nothing of amp. tests/ may depend on anything. A package is
# its top-level directory (tensor/cuda and tensor/io are tensor, nn/models is nn), except
# tools/bazel: the build's own configuration (config_settings such as cpu_only, the CUDA
# constraint, the malloc) is below everything, as Bazel's own rules are. data/ holds files only
# (filegroups of the texts that ship with the repository), so it is the bottom floor. A top-level package missing from the order is
# reported, so a new package must be placed here.
# Edges come from the deps of every rule (select() branches included, implicit toolchain deps
# excluded); external repositories (@absl, @cuda, ...) are not checked.
set -uo pipefail
cd "$(dirname "$0")/.."

readonly ORDER=(data tools/bazel tensor autograd optim amp nn dataset distributed train tools tests)

err=$(mktemp)
trap 'rm -f "$err"' EXIT
graph=$(bazel query --noimplicit_deps --output=graph --nograph:factored 'kind(rule, //...)' \
  2>"$err")
status=$?
if [ "$status" -ne 0 ]; then
  cat "$err" >&2
  echo "layering: bazel query failed (exit ${status})" >&2
  exit 2
fi

# Lines of the graph look like `  "//nn:layers" -> "//autograd:ops"`.
grep -E '^ *"//[^"]*" -> "//[^"]*"' <<<"$graph" |
  sed -E 's/^ *"([^"]*)" -> "([^"]*)".*/\1 \2/' |
  awk -v order="${ORDER[*]}" '
    function package_of(label,    p) {
      p = substr(label, 3)                  # drop the leading //
      if (p ~ /^tools\/bazel[\/:]/) return "tools/bazel"
      sub(/[\/:].*/, "", p)                 # keep the top-level directory
      return p == "" ? "(root)" : p
    }
    BEGIN { n = split(order, names, " "); for (i = 1; i <= n; ++i) floor[names[i]] = i }
    {
      from = package_of($1); to = package_of($2)
      if (from == to) next
      ++checked
      if (!(from in floor) || !(to in floor)) {
        unknown = !(from in floor) ? from : to
        printf "%s -> %s (package %s is not in the layer order of tools/check_layering.sh)\n", $1, $2, unknown
        ++violations
      } else if (floor[from] < floor[to]) {
        printf "%s -> %s (%s depends on %s, which is above it)\n", $1, $2, from, to
        ++violations
      }
    }
    END {
      if (violations > 0) {
        printf "layering: %d violation(s) of %s\n", violations, order
        exit 1
      }
      printf "layering: OK (%d dependencies between packages checked, order %s)\n", checked, order
    }'
