# Sourced by the shell tests (`source tests/skip.sh`, from the runfiles root where Bazel starts a
# test): the way a shell test says that a part of it could not run, so that tools/test.sh counts
# the target as skipped and never as passed.
#
#   skip_part "mnist: /usr/share/datasets/fashion-mnist is missing (tools/setup.sh installs it)"
#
# prints "SKIPPED: <reason>" and (re)writes $XML_OUTPUT_FILE, the test's JUnit report, with one
# test case marked result="skipped" carrying every reason given so far; Bazel keeps a report that
# the test wrote instead of generating one. The test goes on with the parts it can run: a failure
# there still fails the target (Bazel's status comes from the exit code), and a target that exits
# 0 after a skip_part is counted by tools/test.sh as skipped, as a GoogleTest target with a
# GTEST_SKIP is (both write result="skipped" into test.xml). Outside Bazel (no XML_OUTPUT_FILE)
# only the line is printed.

_tg_skip_reasons=()

skip_part() {
  echo "SKIPPED: $1"
  _tg_skip_reasons+=("$1")
  [ -n "${XML_OUTPUT_FILE:-}" ] || return 0
  local name="${TEST_TARGET:-${TEST_BINARY:-shell_test}}" reason escaped
  name="${name//&/&amp;}"; name="${name//</&lt;}"; name="${name//\"/&quot;}"
  {
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo '<testsuites>'
    echo "  <testsuite name=\"$name\" tests=\"1\" failures=\"0\" errors=\"0\" skipped=\"1\">"
    echo "    <testcase name=\"$name\" status=\"run\" result=\"skipped\">"
    for reason in "${_tg_skip_reasons[@]}"; do
      escaped="${reason//&/&amp;}"; escaped="${escaped//</&lt;}"; escaped="${escaped//>/&gt;}"
      escaped="${escaped//\"/&quot;}"
      echo "      <skipped message=\"$escaped\"/>"
    done
    echo '    </testcase>'
    echo '  </testsuite>'
    echo '</testsuites>'
  } >"$XML_OUTPUT_FILE"
}
