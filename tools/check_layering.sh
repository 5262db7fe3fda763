#!/usr/bin/env bash
# The layering check of the test command (tools/test.sh runs it): every dependency between two
# targets of this workspace must point down the package order of docs/architecture.md, read from
# the BUILD files with `bazel query`. Prints each violation as "//from:target -> //to:target
# (from_package above/below to_package)" and exits 1 if there is any, 0 otherwise.
#
#   tools/check_layering.sh     # "layering: OK (N dependencies between packages checked)"
#
# The order, bottom to top; a target may depend on targets of its own floor or of floors below:
#   data < tools/bazel < tensor < autograd < optim < amp < nn < dataset < distributed < train < tools < tests
# optim is below amp, since amp's MixedPrecisionOptimizer wraps an optim::Optimizer (and uses
# optim's clipping), while optim needs nothing of amp. tests/ may depend on anything. A package is
# its top-level directory (tensor/cuda and tensor/io are tensor, nn/models is nn), except
# tools/bazel: the build's own configuration (config_settings such as cpu_only, the CUDA
# constraint, the malloc) is below everything, as Bazel's own rules are. data/ holds files only
# (filegroups of the texts that ship with the repository), so it is the bottom floor. A top-level package missing from the order is
# reported, so a new package must be placed here.
# Edges come from the deps of every rule (select() branches included, implicit toolchain deps
# excluded); external repositories (@absl, @cuda, ...) are not checked.
#
# Inside tensor/, the device boundary (docs/architecture.md):
#   - the device sub-packages are tensor/<name> for every device type of the list in
#     tensor/device.h (TG_DEVICE_TYPES: tensor/cpu, tensor/cuda; a new device is checked by being
#     listed there);
#   - the tensor core (every target of //tensor except the linking targets //tensor:core and
#     //tensor:devices, which add the CPU's and the other devices' backends) depends on no device
#     sub-package, and no file of tensor/ includes a header of one;
#   - no two device sub-packages depend on each other (targets or includes).
# Device branches: outside the device backends (the device sub-packages, the registry in
# tensor/device.h and tensor/device_backend.*) and tests/, no code compares a device with a
# device type other than the CPU (`DeviceType::kCuda`, `is_cuda()`, and the same for every listed
# type): the ops ask the backend (DevicePreferences) instead. The
# CPU (`is_cpu()`) is the host, and code may ask whether memory is host memory, except the ops
# (tensor/ops_*.cc, tensor/composed.*), which branch on no device at all. The few files that must
# name CUDA are in DEVICE_BRANCH_ALLOWED below, each with its reason.
#
#   tools/check_layering.sh --edges FILE   # edges "//from:t //to:t" per line, not bazel query
#   tools/check_layering.sh --src DIR      # grep the sources under DIR (default: the repository)
# (tests/tools:check_layering_test runs both on fabricated violations.)
set -uo pipefail
cd "$(dirname "$0")/.."

# "(root)" is the root package: //:tapegrad, the umbrella of the public API (tapegrad.h).
readonly ORDER=(data tools/bazel tensor autograd optim amp nn dataset distributed "(root)" train tools tests)
# Files outside the device backends that may name CUDA (a path regex, then why).
readonly DEVICE_BRANCH_ALLOWED=(
  "^distributed/nccl_process_group\.cc$|NCCL runs on CUDA only: the group refuses other devices"
  "^train/data_parallel\.cc$|picks the NCCL process group for CUDA devices (gloo else)"
  "^autograd/variable\.h$|libtorch's Tensor::is_cuda() query, asked of the tensor, not branched on"
  "^autograd/factories\.cc$|tg::cuda::device_count() asks the registry how many CUDA devices exist"
)

# The device types, from the one list of them (tensor/device.h): names (cpu cuda) and
# enumerators (kCpu kCuda).
mapfile -t DEVICE_NAMES < <(grep -oP '^\s*X\(k[A-Za-z0-9]+, "\K[a-z0-9_]+' tensor/device.h)
mapfile -t DEVICE_ENUMS < <(grep -oP '^\s*X\(\Kk[A-Za-z0-9]+(?=, ")' tensor/device.h)
if [ "${#DEVICE_NAMES[@]}" -lt 2 ] || [ "${#DEVICE_NAMES[@]}" -ne "${#DEVICE_ENUMS[@]}" ] ||
   [ "${DEVICE_NAMES[0]}" != cpu ]; then
  echo "check_layering: cannot read the device list (TG_DEVICE_TYPES) of tensor/device.h" >&2
  exit 2
fi
device_alt=$(IFS='|'; echo "${DEVICE_NAMES[*]}")                  # cpu|cuda
other_enums=$(IFS='|'; echo "${DEVICE_ENUMS[*]:1}")               # kCuda
other_queries=$(printf 'is_%s\\(\\)|' "${DEVICE_NAMES[@]:1}")    # is_cuda\(\)|
other_branch="DeviceType::(${other_enums})|${other_queries%|}"

edges_file=""
src="."
while [ $# -gt 0 ]; do
  case "$1" in
    --edges) edges_file="$2"; shift 2 ;;
    --src) src="$2"; shift 2 ;;
    *) echo "check_layering: unknown argument $1" >&2; exit 2 ;;
  esac
done

if [ -n "$edges_file" ]; then
  edges=$(cat "$edges_file") || exit 2
else
  err=$(mktemp)
  trap 'rm -f "$err"' EXIT
  graph=$(bazel query --noimplicit_deps --output=graph --nograph:factored 'kind(rule, //...)' \
    2>"$err")
  status=$?
  if [ "$status" -ne 0 ]; then
    cat "$err" >&2
    echo "layering: bazel query failed (exit ${status})" >&2
    exit 2
  fi
  # Lines of the graph look like `  "//nn:layers" -> "//autograd:ops"`.
  edges=$(grep -E '^ *"//[^"]*" -> "//[^"]*"' <<<"$graph" |
    sed -E 's/^ *"([^"]*)" -> "([^"]*)".*/\1 \2/')
fi

# 1. Targets: the package order, and the device sub-packages of tensor/.
awk -v order="${ORDER[*]}" -v devices="${DEVICE_NAMES[*]}" '
    function package_of(label,    p) {
      p = substr(label, 3)                  # drop the leading //
      if (p ~ /^tools\/bazel[\/:]/) return "tools/bazel"
      sub(/[\/:].*/, "", p)                 # keep the top-level directory
      return p == "" ? "(root)" : p
    }
    # tensor/<device> (and its sub-packages), the tensor core, or "" outside tensor/.
    function tensor_part(label,    i) {
      for (i = 1; i <= ndev; ++i) {
        if (index(label, "//tensor/" dev[i] "/") == 1 || index(label, "//tensor/" dev[i] ":") == 1)
          return "tensor/" dev[i]
      }
      if (label ~ /^\/\/tensor:/) return "core"
      return ""
    }
    BEGIN {
      n = split(order, names, " "); for (i = 1; i <= n; ++i) floor[names[i]] = i
      ndev = split(devices, dev, " ")
    }
    NF >= 2 {
      from = package_of($1); to = package_of($2)
      if (from == "tensor" && to == "tensor") {
        a = tensor_part($1); b = tensor_part($2)
        if (a == "core" && b ~ /^tensor\// &&
            $1 != "//tensor:core" && $1 != "//tensor:devices") {
          printf "%s -> %s (the tensor core depends on %s: only //tensor:core and //tensor:devices link device backends)\n", $1, $2, b
          ++violations
        } else if (a ~ /^tensor\// && b ~ /^tensor\// && a != b) {
          printf "%s -> %s (%s depends on %s: device sub-packages must not depend on each other)\n", $1, $2, a, b
          ++violations
        }
        ++checked
        next
      }
      if (from == to) next
      ++checked
      if (!(from in floor) || !(to in floor)) {
        unknown = !(from in floor) ? from : to
        printf "%s -> %s (package %s is not in the layer order of tools/check_layering.sh)\n", $1, $2, unknown
        ++violations
      } else if (floor[from] < floor[to]) {
        printf "%s -> %s (%s depends on %s, which is above it)\n", $1, $2, from, to
        ++violations
      }
    }
    END {
      if (violations > 0) {
        printf "layering: %d violation(s) of %s\n", violations, order
        exit 1
      }
      printf "layering: OK (%d dependencies between packages checked, order %s)\n", checked, order
    }' <<<"$edges"
targets_status=$?

# 2. Sources: includes across the device boundary, and device branches outside the backends.
sources_status=0
report() {
  echo "$1"
  sources_status=1
}
while IFS= read -r hit; do
  [ -z "$hit" ] && continue
  file=${hit%%:*}
  case "$file" in
    tensor/*/*)
      own=${file#tensor/}
      own=${own%%/*}
      included=${hit#*\"tensor/}
      included=${included%%/*}
      if [ "$own" != "$included" ] && [[ " ${DEVICE_NAMES[*]} " == *" $own "* ]]; then
        report "${hit%%:#*} (tensor/${own} includes tensor/${included}: device sub-packages must not depend on each other)"
      fi ;;
    tensor/*) report "${hit%%:#*} (the tensor core includes a device sub-package's header)" ;;
  esac
done < <(cd "$src" && grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]+\"tensor/(${device_alt})/" \
  --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' --include='*.inc' tensor \
  2>/dev/null)

allowed() {
  local entry
  for entry in "${DEVICE_BRANCH_ALLOWED[@]}"; do
    [[ "$1" =~ ${entry%%|*} ]] && return 0
  done
  return 1
}
while IFS= read -r hit; do
  [ -z "$hit" ] && continue
  file=${hit%%:*}
  rest=${hit#*:}
  line=${rest%%:*}
  code=${rest#*:}
  case "$file" in
    tests/* | tensor/device.h | tensor/device_backend.*) continue ;;
    tensor/*/*)
      sub=${file#tensor/}
      [[ " ${DEVICE_NAMES[*]} " == *" ${sub%%/*} "* ]] && continue ;;
  esac
  code=${code%%//*}  # a comment may name a device
  if [[ "$file" =~ ^tensor/(ops_[a-z0-9_]+|composed|ops)\.(cc|h)$ ]]; then
    # The ops ask the backend for every device choice, the CPU's included.
    [[ "$code" =~ DeviceType::|is_(${device_alt})\(\) ]] || continue
    report "${file}:${line}: an op branches on the device: ask the backend (DevicePreferences of tensor/device_backend.h)"
    continue
  fi
  [[ "$code" =~ $other_branch ]] || continue
  allowed "$file" && continue
  report "${file}:${line}: a device branch (DeviceType::kCuda / is_cuda()) outside the device backends: ask the backend (tensor/device_backend.h), or add the file to DEVICE_BRANCH_ALLOWED with its reason"
done < <(cd "$src" && grep -rnE "DeviceType::|is_(${device_alt})\\(\\)" --include='*.h' --include='*.cc' \
  --include='*.cu' --include='*.cuh' --include='*.inc' . 2>/dev/null | sed 's#^\./##')

if [ "$sources_status" -ne 0 ]; then
  echo "layering: the device boundary is crossed in the sources (above)"
else
  echo "layering: sources OK (no include across the device boundary, no device branch outside the backends)"
fi
[ "$targets_status" -eq 0 ] && [ "$sources_status" -eq 0 ] && exit 0
exit 1
