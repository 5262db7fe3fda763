#!/usr/bin/env bash
# tools/check_docs_links.sh on the README and docs/ as they are (every relative link resolves,
# every README command names a rule or script that exists), then on copies with one fault each,
# which it must report with the exact line and exit 1: a link to a missing page, an anchor that no
# heading has, a README label that is no rule, a README script that does not exist. Links inside
# code are not links.
#   $1: tools/check_docs_links.sh; the pages, BUILD files and scripts come as data (runfiles).
set -uo pipefail
check=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# Runs the check on ROOT; sets out and status.
run_check() {
  out=$(bash "$check" "$1" 2>&1)
  status=$?
}

# expect_exactly CASE STATUS OUTPUT: the last check's status and its whole output.
expect_exactly() {
  if [ "$status" -ne "$2" ] || [ "$out" != "$3" ]; then
    fail "$1: exit $status, expected $2; output:"
    echo "$out"
    echo "expected:"
    echo "$3"
  fi
}

# The docs as they are.
run_check .
if [ "$status" -ne 0 ] || [[ "$out" != "docs links: OK ("* ]]; then
  fail "the docs as they are: exit $status; output:"
  echo "$out"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A fresh copy of the checked tree for each case (symlinks of the runfiles followed).
fresh() {
  rm -rf "$tmp/repo"
  mkdir -p "$tmp/repo"
  cp -rL README.md tapegrad.h docs tools amp autograd nn optim tensor "$tmp/repo/"
  chmod -R u+w "$tmp/repo"
}

fresh
echo 'See [nowhere](missing_page.md).' >>"$tmp/repo/docs/semantics.md"
line=$(wc -l <"$tmp/repo/docs/semantics.md")
run_check "$tmp/repo"
expect_exactly "a link to a missing page" 1 \
  "docs/semantics.md:$line: link to missing_page.md: no such file (docs/missing_page.md)
docs links: 1 broken"

fresh
echo 'See [the flags](training.md#no-such-heading).' >>"$tmp/repo/docs/semantics.md"
line=$(wc -l <"$tmp/repo/docs/semantics.md")
run_check "$tmp/repo"
expect_exactly "an anchor no heading has" 1 \
  "docs/semantics.md:$line: link to training.md#no-such-heading: docs/training.md has no heading with anchor #no-such-heading
docs links: 1 broken"

fresh
printf '%s\n' '```sh' 'bazel run //tools:no_such_binary' '```' >>"$tmp/repo/README.md"
line=$(($(wc -l <"$tmp/repo/README.md") - 1))
run_check "$tmp/repo"
expect_exactly "a README label that is no rule" 1 \
  "README.md:$line: //tools:no_such_binary is not a rule of tools/BUILD
docs links: 1 broken"

fresh
echo 'Run `tools/no_such_script.sh` first.' >>"$tmp/repo/README.md"
line=$(wc -l <"$tmp/repo/README.md")
run_check "$tmp/repo"
expect_exactly "a README script that does not exist" 1 \
  "README.md:$line: tools/no_such_script.sh: no such script
docs links: 1 broken"

# Links in inline code and in fenced blocks are text, not links.
fresh
printf '%s\n' 'Write `[text](missing.md)` for a link.' '```' '[text](missing.md)' '```' \
  >>"$tmp/repo/docs/semantics.md"
run_check "$tmp/repo"
if [ "$status" -ne 0 ]; then
  fail "links inside code: exit $status; output:"
  echo "$out"
fi

if [ "$failures" -gt 0 ]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all cases passed"
