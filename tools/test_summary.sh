#!/usr/bin/env bash
# Counts the test targets of a `bazel test --test_summary=short` run for tools/test.sh:
#
#   tools/test_summary.sh LOG TESTLOGS     # TESTLOGS: the run's bazel-testlogs directory
#
# prints "skipped: //target (k of n test cases; first reason)" for each skipped target, then
# "P F S": the numbers of passed, failed and skipped targets.
#
# No target passes by skipping. Bazel calls a test that exits 0 PASSED even when some of it could
# not run, so a PASSED target counts as skipped when its JUnit report (TESTLOGS/<package>/<name>/
# test.xml) has a test case with result="skipped": GoogleTest writes that for every GTEST_SKIP,
# and a shell test writes it through skip_part (tests/skip.sh) when a tool or a data set it needs
# is missing. One skipped case is enough: the target did not fully run. Targets that Bazel itself
# reports SKIPPED (incompatible with the configuration) are skipped too; FAILED, TIMEOUT,
# NO STATUS, INCOMPLETE and FLAKY are failures.
set -uo pipefail

log="$1"
testlogs="$2"

# The first <skipped message="..."> of a report, unescaped, on one line (GoogleTest's message is
# "file:line<newline>reason").
first_skip_reason() {
  grep -m1 -oE '<skipped message="[^"]*"' "$1" | sed -E 's/^<skipped message="//; s/"$//' |
    sed -e 's/&#x0A;/: /g' -e 's/&lt;/</g' -e 's/&gt;/>/g' -e 's/&quot;/"/g' -e "s/&apos;/'/g" \
      -e 's/&amp;/\&/g'
}

# Summary lines look like "//tests/tensor:ops_test   (cached) PASSED in 0.4s".
failed=$(grep -cE '^//[^ ]+ +(\(cached\) +)?(FAILED|TIMEOUT|NO STATUS|INCOMPLETE|FLAKY)' "$log")
skipped=$(grep -cE '^//[^ ]+ +SKIPPED' "$log")
passed=0
# A test case line of either writer: `<testcase name="..." ... result="skipped" ...>`; Bazel's own
# report embeds the test's output in CDATA, where such a line would have to be printed verbatim.
skipped_case='^ *<testcase [^>]*result="skipped"'
for target in $(grep -E '^//[^ ]+ +(\(cached\) +)?PASSED' "$log" | awk '{ print $1 }'); do
  # //tests/data:mnist_test -> TESTLOGS/tests/data/mnist_test/test.xml
  xml="${target#//}"
  xml="${testlogs}/${xml/://}/test.xml"
  if [ -f "$xml" ] && grep -qE "$skipped_case" "$xml"; then
    skipped=$((skipped + 1))
    echo "skipped: ${target} ($(grep -cE "$skipped_case" "$xml") of" \
      "$(grep -cE '^ *<testcase ' "$xml") test cases; $(first_skip_reason "$xml"))"
  else
    passed=$((passed + 1))
  fi
done
echo "${passed} ${failed} ${skipped}"
