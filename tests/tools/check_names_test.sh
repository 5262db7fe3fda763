#!/usr/bin/env bash
# tools/check_names.sh on a small git work tree: clean, it passes; with a comment naming a file
# that does not exist, and with a doc naming a symbol no code has, it fails naming each.
#   $1: tools/check_names.sh
set -uo pipefail
check=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

repo=$tmp/repo
mkdir -p "$repo/tensor" "$repo/docs"
cat >"$repo/tensor/ops.h" <<'CODE'
// Ops; the kernels are in tensor/ops.cc (tg::Ops::Add).
namespace tg { struct Ops { static int Add(int a, int b); }; }
CODE
echo 'int tg::Ops::Add(int a, int b) { return a + b; }' >"$repo/tensor/ops.cc"
echo 'The ops (`tg::Ops::Add`) are declared in tensor/ops.h.' >"$repo/docs/ops.md"
git -C "$repo" init -q && git -C "$repo" add -A

out=$(bash "$check" "$repo" 2>&1)
status=$?
if [ "$status" -ne 0 ] || [[ "$out" != "check_names: OK (2 file names, 2 qualified names)" ]]; then
  fail "a clean tree: exit $status: $out"
fi

echo '// Moved to tensor/kernels.cc; see Ops::Subtract.' >>"$repo/tensor/ops.h"
echo 'Its doc example calls `tg::Ops::Mul`.' >>"$repo/docs/ops.md"
git -C "$repo" add -A
out=$(bash "$check" "$repo" 2>&1)
status=$?
[ "$status" -eq 1 ] || fail "stale names: exit $status, expected 1"
for want in \
  "check_names: tensor/ops.h names tensor/kernels.cc, which does not exist" \
  "check_names: tensor/ops.h names Ops::Subtract, but no code defines or uses Subtract" \
  "check_names: docs/ops.md names Ops::Mul, but no code defines or uses Mul"; do
  grep -qxF "$want" <<<"$out" || fail "missing line: $want (output: $out)"
done

if [ "$failures" -ne 0 ]; then exit 1; fi
echo "check_names_test: OK"
