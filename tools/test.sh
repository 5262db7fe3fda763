#!/usr/bin/env bash
# The README's test command: installs what is missing, checks the package layering
# (tools/check_layering.sh), runs the whole test suite with Bazel, and ends with one line
# "N passed, N failed" counted from Bazel's per-target test results plus the layering check,
# which counts as one test (so a layering violation fails the command like a failed test).
# Extra arguments go to `bazel test` (e.g. tools/test.sh --config=asan).
set -uo pipefail
cd "$(dirname "$0")/.."

bash tools/setup.sh || exit 1

# Before the tests, so that a violation is printed where it is seen; the tests still run.
bash tools/check_layering.sh
layering_status=$?

log=$(mktemp)
trap 'rm -f "$log"' EXIT
bazel test --test_summary=short "$@" //... 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

# Summary lines look like "//tests/tensor:ops_test   (cached) PASSED in 0.4s".
passed=$(grep -E '^//[^ ]+ +(\(cached\) +)?PASSED' "$log" | wc -l)
failed=$(grep -E '^//[^ ]+ +(\(cached\) +)?(FAILED|TIMEOUT|NO STATUS|INCOMPLETE|FLAKY)' "$log" | wc -l)
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # the build or Bazel itself failed before any test reported
fi
if [ "$layering_status" -eq 0 ]; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "tools/check_layering.sh FAILED (its output is above)"
fi
echo "${passed} passed, ${failed} failed"
[ "$status" -eq 0 ] && [ "$failed" -eq 0 ]
