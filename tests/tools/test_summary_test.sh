#!/usr/bin/env bash
# tools/test_summary.sh, the counting of tools/test.sh: a target Bazel reports PASSED counts as
# skipped when its test.xml has a skipped test case (GoogleTest's GTEST_SKIP, or a shell test's
# skip_part from tests/skip.sh), never as passed; failures and Bazel's own SKIPPED are counted;
# the skipped targets are listed with their first reason. Also runs plot_metrics_test.sh with no
# gnuplot on the PATH: it must write the skip report, not pass. Exact output.
set -euo pipefail

summary=tools/test_summary.sh  # relative to the runfiles root, where Bazel runs the test
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
logs="$tmp/testlogs"
mkdir -p "$logs/tests/train/plot_metrics_test" "$logs/tests/data/mnist_test" \
  "$logs/tests/tensor/ops_test"

# 1. A shell test that cannot run: plot_metrics_test.sh without gnuplot (nothing on the PATH; the
# script needs only bash builtins before its check).
out=$(env -i PATH=/nonexistent TEST_TMPDIR="$tmp" TEST_TARGET=//tests/train:plot_metrics_test \
  XML_OUTPUT_FILE="$logs/tests/train/plot_metrics_test/test.xml" \
  /bin/bash tests/train/plot_metrics_test.sh)
[ "$out" = "SKIPPED: gnuplot is not installed (tools/setup.sh installs gnuplot-nox)" ] ||
  { echo "FAIL: plot_metrics_test.sh printed '$out'"; exit 1; }
[ -f "$logs/tests/train/plot_metrics_test/test.xml" ] ||
  { echo "FAIL: plot_metrics_test.sh without gnuplot wrote no skip report (it would count as passed)"; exit 1; }

# 2. GoogleTest's report (1.12 format) of a target where 1 of 3 cases called GTEST_SKIP.
cat >"$logs/tests/data/mnist_test/test.xml" <<'XML'
<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="3" failures="0" disabled="0" errors="0" time="0.1" timestamp="2026-11-28T15:00:00.000" name="AllTests">
  <testsuite name="MnistTest" tests="3" failures="0" disabled="0" skipped="1" errors="0" time="0.1" timestamp="2026-11-28T15:00:00.000">
    <testcase name="ParsesIdx" file="tests/data/mnist_test.cc" line="20" status="run" result="completed" time="0." timestamp="2026-11-28T15:00:00.000" classname="MnistTest" />
    <testcase name="RealFashionMnistTrain" file="tests/data/mnist_test.cc" line="151" status="run" result="skipped" time="0." timestamp="2026-11-28T15:00:00.000" classname="MnistTest">
      <skipped message="tests/data/mnist_test.cc:152&#x0A;/usr/share/datasets/fashion-mnist is not installed &amp; &quot;x&quot; &lt; y"><![CDATA[tests/data/mnist_test.cc:152
/usr/share/datasets/fashion-mnist is not installed]]></skipped>
    </testcase>
    <testcase name="Other" file="tests/data/mnist_test.cc" line="190" status="run" result="completed" time="0." timestamp="2026-11-28T15:00:00.000" classname="MnistTest" />
  </testsuite>
</testsuites>
XML

# 3. Bazel's own report of a test that ran to the end; its output mentions skipping.
cat >"$logs/tests/tensor/ops_test/test.xml" <<'XML'
<?xml version="1.0" encoding="UTF-8"?>
<testsuites>
  <testsuite name="tests/tensor/ops_test" tests="1" failures="0" errors="0">
    <testcase name="tests/tensor/ops_test" status="run" duration="1" time="1"></testcase>
    <system-out>Generated test.log (if the file is not UTF-8, then this may be unreadable):
      <![CDATA[1 of 20 steps skipped="yes" result="skipped"]]>
    </system-out>
  </testsuite>
</testsuites>
XML

# The summary lines of a run: a cached and a fresh PASSED without a report count as passed.
cat >"$tmp/bazel.log" <<'LOG'
INFO: Build completed successfully, 12 total actions
//tests/tensor:ops_test                                                  PASSED in 1.0s
//tests/data:mnist_test                                         (cached) PASSED in 0.1s
//tests/train:plot_metrics_test                                          PASSED in 0.1s
//tests/tensor:no_report_test                                   (cached) PASSED in 0.2s
//tests/tensor/cuda:blas_test                                            SKIPPED
//tests/tools:resume_test                                                FAILED in 3.0s
//tests/tools:gpt_shakespeare_test                                       TIMEOUT in 900.0s
//tests/tools:zero_test                                                  FLAKY, failed in 1 out of 2 in 2.0s
//tests/tools:launch_test                                             NO STATUS
LOG

got=$(bash "$summary" "$tmp/bazel.log" "$logs")
want='skipped: //tests/data:mnist_test (1 of 3 test cases; tests/data/mnist_test.cc:152: /usr/share/datasets/fashion-mnist is not installed & "x" < y)
skipped: //tests/train:plot_metrics_test (1 of 1 test cases; gnuplot is not installed (tools/setup.sh installs gnuplot-nox))
2 4 3'
if [ "$got" != "$want" ]; then
  echo "FAIL: tools/test_summary.sh printed"
  echo "$got"
  echo "expected"
  echo "$want"
  exit 1
fi
echo "test_summary: OK"
