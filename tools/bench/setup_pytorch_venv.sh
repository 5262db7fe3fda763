#!/usr/bin/env bash
# Creates the Python virtual environment that the PyTorch baselines of the
# benchmarks run in (tools/bench/train_step_pytorch.py, gpt2_pytorch.py).
# Benchmarks only: no build or test needs PyTorch.
#
#   tools/bench/setup_pytorch_venv.sh [VENV_DIR]     (default: ~/.cache/tapegrad/torch-venv)
#
# Prints the venv's python on the last line. TORCH_VERSION pins the wheel
# (default: the newest on the package index).
set -euo pipefail
venv="${1:-${HOME}/.cache/tapegrad/torch-venv}"
if [[ ! -x "${venv}/bin/python" ]]; then
  python3 -m venv "${venv}"
fi
py="${venv}/bin/python"
if ! "${py}" -c 'import torch' 2>/dev/null; then
  "${py}" -m pip install --quiet "torch${TORCH_VERSION:+==${TORCH_VERSION}}" numpy >&2
fi
"${py}" -c 'import torch, sys; print("torch", torch.__version__, file=sys.stderr)' 
echo "${py}"
