#!/usr/bin/env bash
# tools:trace_backward writes trace.json (parseable, with traceEvents), trace.txt and graph.dot,
# and says so when Graphviz's `dot` is missing; an unknown example exits 2, names the examples
# and creates nothing.
set -euo pipefail
tool="$1"
out="${TEST_TMPDIR:-$(mktemp -d)}/trace"
"$tool" --example=non_reentrant_checkpoint --out="$out" >"$out.log" 2>&1 || {
  cat "$out.log"; exit 1; }
for f in trace.json trace.txt graph.dot; do
  [ -s "$out/$f" ] || { echo "missing $out/$f"; cat "$out.log"; exit 1; }
done
grep -q '"traceEvents"' "$out/trace.json" || { echo "no traceEvents"; exit 1; }
grep -q 'recompute_begin non_reentrant' "$out/trace.txt" || { echo "no recompute in trace.txt"; exit 1; }
grep -q '^digraph backward {' "$out/graph.dot" || { echo "not a DOT graph"; exit 1; }
if command -v dot >/dev/null 2>&1; then
  [ -s "$out/graph.svg" ] && [ -s "$out/graph.png" ] || { echo "dot present but no svg/png"; exit 1; }
else
  grep -q 'Graphviz `dot` is not installed: wrote graph.dot only' "$out.log" || {
    echo "no notice about the missing dot"; cat "$out.log"; exit 1; }
fi
set +e
"$tool" --example=nope --out="$out" >"$out.log" 2>&1
status=$?
set -e
[ "$status" -eq 2 ] || { echo "unknown example: exit $status, expected 2"; exit 1; }
grep -q "no trace example named 'nope' (examples: reentrant_checkpoint, non_reentrant_checkpoint, amp_skipped_step, ddp_2_ranks)" "$out.log" || { cat "$out.log"; exit 1; }
# ... and creates nothing: the output directory is checked for only after the name.
fresh="${TEST_TMPDIR:-$(mktemp -d)}/not_created"
set +e
"$tool" --example=nope --out="$fresh" >"$out.log" 2>&1
status=$?
set -e
[ "$status" -eq 2 ] || { echo "unknown example: exit $status, expected 2"; exit 1; }
[ ! -e "$fresh" ] || { echo "an unknown example created $fresh"; exit 1; }
echo "trace_backward: OK"
