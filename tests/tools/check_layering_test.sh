#!/usr/bin/env bash
# tools/check_layering.sh on fabricated trees: each violation it exists to catch (the tensor core
# depending on a device sub-package, tensor/cpu and tensor/cuda depending on each other, a
# package depending on one above it, an include across the device boundary, a device branch
# outside the backends) makes it fail with its message; a tree without one passes. Then the
# device-boundary part on this repository's real sources, which must pass.
set -uo pipefail
check="$1"
real_src="$(cd "$(dirname "$(readlink -f "$check")")/.." && pwd)"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0

# expect STATUS NEEDLE -- args...: runs the check, wants its exit status and a line with NEEDLE.
expect() {
  local want_status="$1" needle="$2"
  shift 3
  local out status
  out=$(bash "$check" "$@" 2>&1)
  status=$?
  if [ "$status" -ne "$want_status" ] || ! grep -qF -- "$needle" <<<"$out"; then
    echo "FAIL: check_layering.sh $* exited ${status} (want ${want_status}) without \"${needle}\":"
    echo "$out"
    failures=$((failures + 1))
  fi
}

# A clean source tree: host checks (is_cpu) are allowed, comments may name CUDA.
clean="$tmp/clean"
mkdir -p "$clean/tensor/cpu" "$clean/tensor/cuda" "$clean/nn"
printf '#include "tensor/device_backend.h"\nbool Host(Device d) { return d.is_cpu(); }\n' \
  >"$clean/tensor/tensor.cc"
printf '#include "tensor/cpu/parallel.h"\n' >"$clean/tensor/cpu/backend.cc"
printf '// GetDeviceBackend(DeviceType::kCuda) in a comment\nvoid F();\n' >"$clean/nn/a.cc"
printf '//nn:module //tensor:core\n//tensor:core //tensor/cpu:backend\n//tensor:devices //tensor/cuda:backend\n//tensor/cpu:backend //tensor:base\n' \
  >"$tmp/clean_edges"
expect 0 "layering: OK (4 dependencies between packages checked" -- \
  --edges "$tmp/clean_edges" --src "$clean"
expect 0 "layering: sources OK" -- --edges "$tmp/clean_edges" --src "$clean"

# Target edges.
echo "//tensor:base //tensor/cpu:backend" >"$tmp/e1"
expect 1 "//tensor:base -> //tensor/cpu:backend (the tensor core depends on tensor/cpu: only //tensor:core and //tensor:devices link device backends)" -- \
  --edges "$tmp/e1" --src "$clean"
echo "//tensor:ops //tensor/cuda:runtime" >"$tmp/e2"
expect 1 "//tensor:ops -> //tensor/cuda:runtime (the tensor core depends on tensor/cuda: only //tensor:core and //tensor:devices link device backends)" -- \
  --edges "$tmp/e2" --src "$clean"
echo "//tensor/cpu:kernels //tensor/cuda:runtime" >"$tmp/e3"
expect 1 "//tensor/cpu:kernels -> //tensor/cuda:runtime (tensor/cpu depends on tensor/cuda: device sub-packages must not depend on each other)" -- \
  --edges "$tmp/e3" --src "$clean"
echo "//tensor:ops //nn:module" >"$tmp/e4"
expect 1 "//tensor:ops -> //nn:module (tensor depends on nn, which is above it)" -- \
  --edges "$tmp/e4" --src "$clean"
expect 1 "layering: 1 violation(s) of" -- --edges "$tmp/e4" --src "$clean"

# Sources: an include across the boundary, and device branches.
inc="$tmp/include"
cp -r "$clean" "$inc"
printf 'int a;\n#include "tensor/cpu/vec_math.h"\n' >"$inc/tensor/tensor.cc"
expect 1 "tensor/tensor.cc:2 (the tensor core includes a device sub-package's header)" -- \
  --edges "$tmp/clean_edges" --src "$inc"
cross="$tmp/cross"
cp -r "$clean" "$cross"
printf '#include "tensor/cpu/rows.h"\n' >"$cross/tensor/cuda/fused.cc"
expect 1 "tensor/cuda/fused.cc:1 (tensor/cuda includes tensor/cpu: device sub-packages must not depend on each other)" -- \
  --edges "$tmp/clean_edges" --src "$cross"
branch="$tmp/branch"
cp -r "$clean" "$branch"
printf 'void F(const Tensor& q) {\n  if (q.device().is_cuda()) return;\n}\n' >"$branch/tensor/generator_y.cc"
printf 'bool G(Device d) { return d.type == DeviceType::kCuda; }\n' >"$branch/nn/b.cc"
expect 1 "tensor/generator_y.cc:2: a device branch (DeviceType::kCuda / is_cuda()) outside the device backends: ask the backend (tensor/device_backend.h), or add the file to DEVICE_BRANCH_ALLOWED with its reason" -- \
  --edges "$tmp/clean_edges" --src "$branch"
expect 1 "nn/b.cc:1: a device branch" -- --edges "$tmp/clean_edges" --src "$branch"
expect 1 "layering: the device boundary is crossed in the sources (above)" -- \
  --edges "$tmp/clean_edges" --src "$branch"
# The ops branch on no device, not even the host's (the attention layout was such a branch).
ops="$tmp/ops"
cp -r "$clean" "$ops"
printf 'Tensor A(const Tensor& q) {\n  return q.device().is_cpu() ? q : q.contiguous();\n}\n' \
  >"$ops/tensor/ops_attention.cc"
expect 1 "tensor/ops_attention.cc:2: an op branches on the device: ask the backend (DevicePreferences of tensor/device_backend.h)" -- \
  --edges "$tmp/clean_edges" --src "$ops"
# The same branch in a backend, in a test, or in an allowed file passes.
allowed="$tmp/allowed"
cp -r "$clean" "$allowed"
mkdir -p "$allowed/tests/nn" "$allowed/distributed"
printf 'bool G(Device d) { return d.is_cuda(); }\n' | tee "$allowed/tensor/cuda/x.cc" \
  "$allowed/tests/nn/t.cc" "$allowed/distributed/nccl_process_group.cc" >/dev/null
expect 0 "layering: sources OK" -- --edges "$tmp/clean_edges" --src "$allowed"

# This repository's sources (the target graph of the real tree is checked by tools/test.sh,
# which can run bazel query).
expect 0 "layering: sources OK" -- --edges "$tmp/clean_edges" --src "$real_src"

if [ "$failures" -ne 0 ]; then
  echo "${failures} check(s) failed"
  exit 1
fi
echo "PASS"
