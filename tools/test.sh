#!/usr/bin/env bash
# The README's test command: installs what is missing, checks the package layering
# (tools/check_layering.sh) and the names in comments and docs (tools/check_names.sh), runs the
# whole test suite with Bazel, and ends with one line "N passed, N failed, N skipped" counted from
# Bazel's per-target test results plus the two checks, each counted as one test (so a layering
# violation or a stale name fails the command like a failed test).
# Extra arguments go to `bazel test` (e.g. tools/test.sh --config=asan).
#
# No target passes by skipping (tools/test_summary.sh counts): a target that Bazel reports PASSED
# is counted as skipped when its test.xml has a test case with result="skipped", which GoogleTest
# writes for a GTEST_SKIP (a CUDA test on a machine without a GPU) and a shell test through
# skip_part (tests/skip.sh) when a tool or a data set it needs is missing. One skipped case is
# enough: the target did not fully run. Each skipped target is listed with its first reason;
# targets Bazel itself skips as incompatible (CUDA under --config=cpu) are skipped too. Skips do
# not fail the command.
set -uo pipefail
cd "$(dirname "$0")/.."

bash tools/setup.sh || exit 1

# Before the tests, so that a violation is printed where it is seen; the tests still run.
bash tools/check_layering.sh
layering_status=$?
bash tools/check_names.sh
names_status=$?

log=$(mktemp)
trap 'rm -f "$log"' EXIT
bazel test --test_summary=short "$@" //... 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

summary=$(bash tools/test_summary.sh "$log" bazel-testlogs)
sed '$d' <<<"$summary"  # the skipped targets, with their reasons
read -r passed failed skipped < <(tail -n 1 <<<"$summary")
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # the build or Bazel itself failed before any test reported
fi
if [ "$layering_status" -eq 0 ]; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "tools/check_layering.sh FAILED (its output is above)"
fi
if [ "$names_status" -eq 0 ]; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "tools/check_names.sh FAILED (its output is above)"
fi
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
[ "$status" -eq 0 ] && [ "$failed" -eq 0 ]
