#!/usr/bin/env bash
# Runs HERE (the build machine, no GPU): builds the CUDA-tagged tests and the given benchmarks
# with -c opt and copies them into gpu_bin/ with every shared library they load that the GPU
# machine does not have, so that `run` can carry gpu_bin/ there and tools/gpu/run_on_device.sh
# can run them without Bazel.
#
#   tools/gpu/stage.sh [--tests LABEL,LABEL...] [--out DIR] [BENCH_LABEL[='ARGS'] ...]
#   tools/gpu/stage.sh //tools/bench:amp_step                      # all cuda tests + a bench
#   tools/gpu/stage.sh --tests //tests/tensor/cuda:blas_test       # just these tests
#   tools/gpu/stage.sh --tests //tests/tensor/cuda:fp8_kernels_test # the FP8 kernels (issue 30)
#   tools/gpu/stage.sh //tools/bench:gpt2_gpu='--weights=bf16' //tools/bench:gpt2_gpu='--weights=f32'
#                                                                  # one run per ARGS
#
# Tests: `bazel query 'attr(tags, "\bcuda\b", tests(//...))'` unless --tests names them.
# Layout: DIR/tests/<package_path>__<name>, DIR/bench/<name> (and <name>.args when ARGS are
# given), DIR/lib/ (shared libraries); and gpu_pack/DIR.tar.xz, the same folder compressed,
# which is what travels to the GPU machine (the device tool carries at most 64 MiB).
#
# Linking: Bazel links cc_test binaries against one shared library per cc_library
# (bazel-bin/_solib_k8/...), found through an RPATH into the output tree. Those, and the Debian
# system libraries that the GPU machine's image lacks (abseil, OpenBLAS, gloo, tcmalloc, ...),
# are copied into DIR/lib; run_on_device.sh puts DIR/lib on LD_LIBRARY_PATH. Not copied: glibc,
# libstdc++/libgcc_s (the GPU machine's are newer) and the CUDA libraries (cudart, cuBLAS(Lt),
# cuDNN, NCCL, the driver's libcuda), which come from the GPU machine's PyTorch install.
# Sharing the libraries keeps DIR small: the device tool carries at most 64 MiB in all.
set -euo pipefail

cd "$(git rev-parse --show-toplevel)"
OUT_DIR=gpu_bin
TESTS=""
BENCHES=()
while (($#)); do
  case $1 in
    --tests) TESTS=${2//,/ }; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) BENCHES+=("$1"); shift ;;
  esac
done

if [[ -z $TESTS ]]; then
  # --keep_going: a package that another change has broken must not hide the others.
  TESTS=$(bazel query --keep_going 'attr(tags, "\bcuda\b", tests(//...))' 2>/dev/null || true)
fi
read -r -a test_labels <<<"$(tr '\n' ' ' <<<"$TESTS")"
bench_labels=()
for b in "${BENCHES[@]}"; do bench_labels+=("${b%%=*}"); done
targets=("${test_labels[@]}" "${bench_labels[@]}")
if ((${#targets[@]} == 0)); then
  echo "stage: nothing to build (no cuda-tagged tests found, no benchmarks given)" >&2
  exit 1
fi
echo "stage: building with -c opt: ${targets[*]}"
bazel build -c opt --keep_going "${targets[@]}" || echo "stage: some targets failed to build; copying the others" >&2
BAZEL_BIN=$(bazel info -c opt bazel-bin 2>/dev/null)

rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR/tests" "$OUT_DIR/bench" "$OUT_DIR/lib"

# Libraries that the GPU machine provides itself (see the header).
is_provided() {
  case $(basename "$1") in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|ld-linux*|linux-vdso*) return 0 ;;
    libstdc++.so*|libgcc_s.so*) return 0 ;;
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libcudnn*.so*|libnccl.so*) return 0 ;;
    libnvrtc*.so*|libnvJitLink.so*) return 0 ;;
  esac
  return 1
}

copy_libs() {  # binary, in the output tree (its RPATH is relative to it)
  local line name path
  while IFS= read -r line; do
    if [[ $line == *"not found"* ]]; then
      echo "stage: $1 needs ${line%% *} which is not found here either" >&2
      return 1
    fi
    [[ $line == *" => /"* ]] || continue
    name=$(awk '{print $1}' <<<"$line")
    path=$(awk '{print $3}' <<<"$line")
    is_provided "$name" && continue
    [[ -e $OUT_DIR/lib/$name ]] || cp -L "$path" "$OUT_DIR/lib/$name"
  done < <(ldd "$1")
}

stage_one() {  # label kind [args]
  local label=$1 kind=$2 args=${3-} pkg name src dest
  pkg=${label#//}
  pkg=${pkg%%:*}
  name=${label##*:}
  src=$BAZEL_BIN/$pkg/$name
  if [[ ! -x $src ]]; then
    echo "stage: $label: no binary at $src (did it build?)" >&2
    return 1
  fi
  if [[ $kind == tests ]]; then
    dest=$OUT_DIR/tests/${pkg//\//_}__$name
  else
    dest=$OUT_DIR/bench/$name
    # A benchmark named twice with different ARGS runs once per line of NAME.args.
    [[ -n $args ]] && printf '%s\n' "$args" >>"$dest.args"
  fi
  copy_libs "$src" || return 1
  if [[ ! -e $dest ]]; then
    cp -L "$src" "$dest"
    chmod u+w "$dest"
  fi
  echo "stage: $label -> $dest"
}

status=0
for t in "${test_labels[@]}"; do stage_one "$t" tests || status=1; done
for b in "${BENCHES[@]}"; do
  if [[ $b == *=* ]]; then stage_one "${b%%=*}" bench "${b#*=}" || status=1
  else stage_one "$b" bench || status=1; fi
done
chmod -R u+w "$OUT_DIR"
size_kib=$(du -sk "$OUT_DIR" | cut -f1)
count() { find "$1" -maxdepth 1 -type f ! -name '*.args' | wc -l; }
echo "stage: $OUT_DIR holds $((size_kib / 1024)) MiB ($(count "$OUT_DIR/tests") tests," \
  "$(count "$OUT_DIR/bench") benchmarks, $(count "$OUT_DIR/lib") libraries)"
# The device tool carries at most 64 MiB with the working tree, and OpenBLAS alone is 35 MiB:
# carry an xz archive (about a sixth of the size), which run_on_device.sh unpacks there.
PACK=gpu_pack/$(basename "$OUT_DIR").tar.xz
mkdir -p gpu_pack
rm -f "$PACK"
tar -cf - "$OUT_DIR" | xz -T0 -6 >"$PACK"
pack_kib=$(du -sk "$PACK" | cut -f1)
echo "stage: $PACK holds $((pack_kib / 1024)) MiB"
if ((pack_kib > 60 * 1024)); then
  echo "stage: warning: the device tool carries at most 64 MiB with the working tree; stage fewer targets" >&2
fi
echo "stage: next: run(command='tools/gpu/run_on_device.sh $PACK', carry=['gpu_pack'])"
exit $status
