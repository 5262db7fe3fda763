#!/usr/bin/env bash
# Installs every Debian package that tapegrad's build, tests and default training need.
# Idempotent: when everything is present it changes nothing and touches no network.
# The CUDA toolkit (nvcc, cuBLAS/cuBLASLt, cuDNN 9, NCCL) comes with the machine image; on a
# machine without it the build goes CPU-only (see the end of this script).
set -euo pipefail

packages=(
  bazel-bootstrap        # Bazel 4.2.3 (WORKSPACE mode, offline stand-ins in tools/bazel)
  g++
  libabsl-dev            # abseil: Status, StrCat, flags
  libgtest-dev           # GoogleTest
  libopenblas-openmp-dev # CPU GEMM, OpenBLAS's OpenMP build: one thread pool with our kernels
  libdnnl-dev            # oneDNN (OpenMP runtime): CPU convolution, pooling, bf16/f16 matmul
  libhwy-dev             # Highway: the CPU kernels' SIMD, dispatched on the CPU at run time
  zlib1g-dev             # gzip'd data files
  libgloo-dev            # CPU collectives
  libhiredis-dev         # gloo's RedisStore header includes <hiredis.h>
  redis-server           # multi-machine rendezvous; tests start one on loopback
  libgoogle-perftools-dev  # TCMalloc, the allocator of every binary (tools/bazel/BUILD)
  nlohmann-json3-dev     # JSON headers of safetensors checkpoints
  gnuplot-nox            # tools/plot_metrics.sh: loss and loss-scale curves as PNG
  graphviz               # tools/trace_backward: the backward graph as SVG/PNG
  dataset-fashion-mnist  # default training data
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Without the CUDA toolkit (/usr/local/cuda, where tools/bazel/cuda_configure.bzl looks), every
# build is a CPU-only build: .bazelrc.local (read by .bazelrc, not in git) gets
# `build --config=cpu`, which skips the CUDA targets. With the toolkit that line is removed.
root="$(cd "$(dirname "$0")/.." && pwd)"
rc_local="$root/.bazelrc.local"
cpu_line="build --config=cpu  # written by tools/setup.sh: no CUDA toolkit on this machine"
if [ ! -x /usr/local/cuda/bin/nvcc ]; then
  if ! grep -qxF "$cpu_line" "$rc_local" 2>/dev/null; then
    echo "setup: no CUDA toolkit at /usr/local/cuda: building without CUDA (--config=cpu, in .bazelrc.local)" >&2
    echo "$cpu_line" >>"$rc_local"
  fi
elif [ -f "$rc_local" ] && grep -qxF "$cpu_line" "$rc_local"; then
  grep -vxF "$cpu_line" "$rc_local" >"$rc_local.tmp" || true
  mv "$rc_local.tmp" "$rc_local"
fi
