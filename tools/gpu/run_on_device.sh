#!/usr/bin/env bash
# Runs ON the lent GPU machine, from the repository root: makes the CUDA libraries of the
# machine's PyTorch install visible to tapegrad's binaries, reports which versions it found,
# prints nvidia-smi, then runs every test binary and every benchmark binary that
# tools/gpu/stage.sh put into the binary folder. There is no Bazel and no network there.
#
#   tools/gpu/run_on_device.sh [BIN_DIR | ARCHIVE.tar.xz]   # default gpu_bin
#   env: OUT (logs; default ./gpu_out), TEST_TIMEOUT (s per test, 300),
#        BENCH_TIMEOUT (s per benchmark, 300), GTEST_FILTER (passed through to the tests)
#
# Writes four files into $OUT (the device tool returns at most 8): env.log (nvidia-smi, library
# versions, LD_LIBRARY_PATH), tests.log (every test's output), bench.log (every benchmark's
# output) and summary.txt (one line per binary: PASS / FAIL rc / TIMEOUT, skipped-test counts).
# A benchmark runs once per line of BIN_DIR/bench/NAME.args (stage.sh's ARGS, where the text
# $OUT stands for the output folder), or once without.
# Exit status: 0 when every test passed, 1 when one failed, 2 when libraries are missing.
#
# Libraries: the binaries are built here against CUDA 13 (libcudart.so.13, libcublasLt.so.13,
# libcublas.so.13), cuDNN 9 (libcudnn.so.9) and NCCL 2 (libnccl.so.2) from /usr/local/cuda.
# The machine's pip packages (site-packages/nvidia/*/lib: nvidia-cuda-runtime, nvidia-cublas,
# nvidia-cudnn-cu13, nvidia-nccl-cu13) provide the same sonames when PyTorch there is a CUDA 13
# build. If it ships CUDA 12 libraries instead (libcudart.so.12), the CUDA 13 binaries cannot
# load them: link cudart statically or build against CUDA 12 (see tools/gpu/README.md); the
# version report below says which case this is.
set -uo pipefail

BIN=${1:-gpu_bin}
OUT=${OUT:-$PWD/gpu_out}
TEST_TIMEOUT=${TEST_TIMEOUT:-300}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-300}
mkdir -p "$OUT"
ENV_LOG=$OUT/env.log
TESTS_LOG=$OUT/tests.log
BENCH_LOG=$OUT/bench.log
SUMMARY=$OUT/summary.txt
: >"$ENV_LOG"
: >"$TESTS_LOG"
: >"$BENCH_LOG"
: >"$SUMMARY"

say() { echo "$@" | tee -a "$ENV_LOG"; }

if [[ -f $BIN && $BIN == *.tar.xz ]]; then  # stage.sh's archive (gpu_pack/gpu_bin.tar.xz)
  unpack=$(mktemp -d)
  # tar needs xz(1); python3's tarfile (lzma) is the fallback where the image lacks it.
  if ! { command -v xz >/dev/null && tar -xJf "$BIN" -C "$unpack"; } &&
     ! python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
       "$BIN" "$unpack"; then
    echo "run_on_device: cannot unpack $BIN" >&2
    exit 2
  fi
  BIN=$(find "$unpack" -mindepth 1 -maxdepth 1 -type d | head -n 1)
fi
if [[ ! -d $BIN ]]; then
  echo "run_on_device: no binary folder '$BIN' (make it here with tools/gpu/stage.sh and name it in carry)" >&2
  exit 2
fi
BIN=$(cd "$BIN" && pwd)  # absolute: the tests run from the repository root

# ---- Library folders: site-packages/nvidia/*/lib of the python3 that holds PyTorch -------------
PY=$(command -v python3 || true)
say "python3: ${PY:-none}"
site_dirs=()
if [[ -n $PY ]]; then
  while IFS= read -r d; do
    [[ -n $d && -d $d ]] && site_dirs+=("$d")
  done < <("$PY" - <<'PYEOF' 2>/dev/null
import os, site
dirs = list(site.getsitepackages())
try:
    import torch
    dirs.append(os.path.dirname(os.path.dirname(torch.__file__)))
except Exception:
    pass
seen = set()
for d in dirs:
    if d not in seen:
        seen.add(d)
        print(d)
PYEOF
  )
fi
lib_dirs=()
for sp in "${site_dirs[@]}"; do
  say "site-packages: $sp"
  # nvidia/<component>/lib (cudnn, nccl, ...) and nvidia/cu13/lib (the CUDA 13 wheels' layout).
  for d in "$sp"/nvidia/*/lib "$sp"/nvidia/*/*/lib; do
    [[ -d $d ]] && lib_dirs+=("$d")
  done
done
[[ -d /usr/local/cuda/lib64 ]] && lib_dirs+=(/usr/local/cuda/lib64)
path="$BIN/lib"
for d in "${lib_dirs[@]}"; do path="$path:$d"; done
export LD_LIBRARY_PATH="$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

# ---- What is there: files and sonames of the libraries tapegrad links -------------------------
soname() {
  if command -v readelf >/dev/null; then
    readelf -d "$1" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p'
  fi
}
say ""
say "== CUDA libraries found (file -> soname) =="
for lib in libcudart libcublasLt libcublas libcudnn libnccl; do
  found=0
  for d in "${lib_dirs[@]}"; do
    for f in "$d/$lib".so*; do
      [[ -e $f ]] || continue
      found=1
      say "  $f -> $(soname "$f")"
    done
  done
  ((found)) || say "  $lib: none"
done
if [[ -n $PY ]]; then
  say ""
  say "== pip packages and PyTorch's view =="
  "$PY" -m pip list 2>/dev/null | grep -iE '^(nvidia-|torch )' | tee -a "$ENV_LOG"
  "$PY" - <<'PYEOF' 2>&1 | tee -a "$ENV_LOG"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda,
      "cudnn", torch.backends.cudnn.version(),
      "nccl", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-")
PYEOF
fi

# ---- Every binary and shared library must resolve ---------------------------------------------
binaries=()
for f in "$BIN"/tests/* "$BIN"/bench/*; do
  [[ -f $f && -x $f ]] && binaries+=("$f")
done
missing=$(for f in "${binaries[@]}" "$BIN"/lib/*.so*; do
  [[ -e $f ]] && ldd "$f" 2>/dev/null | awk '/not found/ {print $1}'
done | sort -u)
if [[ -n $missing ]]; then
  say ""
  say "run_on_device: FAILED: these libraries are needed but not found:"
  for m in $missing; do say "  $m"; done
  say "Found above: the CUDA libraries of this machine. If they are CUDA 12 (libcudart.so.12,"
  say "libcublasLt.so.12), our CUDA 13 binaries need static cudart or a CUDA-12 build"
  say "(tools/gpu/README.md). Other libraries belong in $BIN/lib (tools/gpu/stage.sh copies them)."
  exit 2
fi

say ""
say "== nvidia-smi =="
nvidia-smi 2>&1 | tee -a "$ENV_LOG"

# ---- Tests, then benchmarks ---------------------------------------------------------------------
failed=0
run_one() {  # kind log timeout binary [arguments...]
  local kind=$1 log=$2 limit=$3 bin=$4 name rc start seconds tmp skipped
  shift 4
  name=$(basename "$bin")
  tmp=$(mktemp -d)
  echo "==== $name $*" >>"$log"
  start=$(date +%s)
  TEST_TMPDIR=$tmp GTEST_COLOR=no timeout "$limit" "$bin" "$@" </dev/null >"$tmp/.log" 2>&1
  rc=$?
  seconds=$(($(date +%s) - start))
  cat "$tmp/.log" >>"$log"
  # gtest's summary line "[  SKIPPED ] 3 tests, listed below:".
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}, listed below:.*/\1/p' "$tmp/.log")
  rm -rf "$tmp"
  local status=PASS
  if ((rc == 124)); then
    status="TIMEOUT (${limit}s)"
  elif ((rc != 0)); then
    status="FAIL rc=$rc"
  fi
  [[ $kind == test && $status != PASS ]] && failed=1
  echo "$kind $name${*:+ $*}: $status, ${seconds}s, ${skipped:-0} skipped" | tee -a "$SUMMARY"
}
for f in "$BIN"/tests/*; do
  [[ -f $f && -x $f ]] && run_one test "$TESTS_LOG" "$TEST_TIMEOUT" "$f"
done
# A benchmark runs once per line of BIN/bench/NAME.args (stage.sh's ARGS), or once without.
for f in "$BIN"/bench/*; do
  [[ -f $f && -x $f ]] || continue
  if [[ -f $f.args ]]; then
    while IFS= read -r line; do
      read -r -a args <<<"${line//\$OUT/$OUT}"  # ARGS may name files under $OUT (metrics)
      run_one bench "$BENCH_LOG" "$BENCH_TIMEOUT" "$f" "${args[@]}"
    done <"$f.args"
  else
    run_one bench "$BENCH_LOG" "$BENCH_TIMEOUT" "$f"
  fi
done
echo "logs in $OUT: env.log tests.log bench.log summary.txt"
exit $failed
