#!/usr/bin/env bash
# Builds one reader's libFuzzer target (--config=fuzz: clang-14, ASan + UBSan) and fuzzes it for
# a while, starting from a working copy of its seed corpus.
#
#   tools/fuzz/run.sh <reader> [seconds] [libFuzzer flags...]
#   tools/fuzz/run.sh safetensors 10
#   tools/fuzz/run.sh checkpoint 3600 -fork=4   # an hour, 4 processes
#
# <reader>: safetensors | checkpoint | idx | token_shard | text. [seconds]: default 60.
# The working corpus (the seeds plus the inputs libFuzzer adds) and the crash files live in
# $TG_FUZZ_DIR/<reader>/{corpus,artifacts} (default /tmp/tapegrad-fuzz), kept between runs, so a
# longer or later run goes on from what earlier ones found. Needs clang-14 and libclang-rt-14-dev.
set -euo pipefail
cd "$(dirname "$0")/../.."

readers=(safetensors checkpoint idx token_shard text)
reader=${1:-}
if [ -z "$reader" ] || [[ " ${readers[*]} " != *" ${reader} "* ]]; then
  echo "usage: tools/fuzz/run.sh <reader> [seconds] [libFuzzer flags...]" >&2
  echo "  <reader>: safetensors | checkpoint | idx | token_shard | text" >&2
  exit 2
fi
seconds=${2:-60}
shift $(($# < 2 ? $# : 2))

runtime=(/usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a)
if ! command -v clang-14 >/dev/null || [ ! -f "${runtime[0]}" ]; then
  echo "run.sh: needs clang-14 and libFuzzer: sudo apt-get install clang-14 libclang-rt-14-dev" >&2
  exit 1
fi

bazel build --config=fuzz "//tools/fuzz:${reader}_fuzzer"
bin="$(bazel info --config=fuzz bazel-bin 2>/dev/null)/tools/fuzz/${reader}_fuzzer"
work="${TG_FUZZ_DIR:-/tmp/tapegrad-fuzz}/${reader}"
mkdir -p "$work/corpus" "$work/artifacts"
for seed in "tools/fuzz/corpus/${reader}/"*; do  # adds the seeds, keeps what earlier runs found
  [ -e "$work/corpus/${seed##*/}" ] || cp "$seed" "$work/corpus/"
done

# Inputs stay small (the seeds are < 4 KiB), so one allocation of more than 256 MB, or 2 GB of
# memory in all, is a reader allocating what the file does not hold: reported as a crash.
status=0
"$bin" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -malloc_limit_mb=256 \
  -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$@" "$work/corpus" || status=$?
if [ "$status" -ne 0 ]; then
  echo "run.sh: ${reader}_fuzzer failed (exit ${status}); its input is in ${work}/artifacts/." >&2
  echo "  reproduce: ${bin} ${work}/artifacts/<crash-file>" >&2
  echo "  minimize:  ${bin} -minimize_crash=1 -max_total_time=60 ${work}/artifacts/<crash-file>" >&2
fi
exit "$status"
