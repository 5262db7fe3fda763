#!/usr/bin/env bash
# The README's test command: installs what is missing, runs the whole test suite with Bazel,
# and ends with one line "N passed, N failed" counted from Bazel's per-target test results.
# Extra arguments go to `bazel test` (e.g. tools/test.sh --config=asan).
set -uo pipefail
cd "$(dirname "$0")/.."

bash tools/setup.sh || exit 1

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
echo "${passed} passed, ${failed} failed"
[ "$status" -eq 0 ] && [ "$failed" -eq 0 ]
