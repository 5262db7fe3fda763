#!/usr/bin/env python3
"""Runs torch.optim.Muon (torch 2.15) and tapegrad's optim::Muon (tests/optim:muon_trace) for the
same steps from the same f32 inputs and compares their parameters and momentum buffers bit for bit,
for Nesterov on and off, the original and match_rms_adamw learning rates, and the bf16 iteration
(torch's) and an f64 one (torch's code with its bf16 read as f64, as muon_reference.py does):

  bazel build -c opt //tests/optim:muon_trace
  ~/.cache/tapegrad/torch-venv/bin/python tests/optim/muon_trace_compare.py \\
      bazel-bin/tests/optim/muon_trace --steps 1000

Inputs (tests/optim/muon_trace_inputs.h): a [16, 40] and a [48, 24] parameter at p[i][j] = 0.5 sin(1.3 i + 0.7 j + k), gradients
g_t[i][j] = cos(0.9 i - 1.1 j + 0.5 t + k), both computed in f64 and rounded to f32; lr 0.02 and
torch's other defaults. Prints, per case and tensor, how many elements differ and the largest
difference in f32 ulps and in value. A manual check (torch is not needed by the build or the tests).
"""
import argparse
import math
import struct
import subprocess

import torch
import torch.optim._muon as muon_module

SHAPES = [(16, 40), (48, 24)]


class _F64Torch:
    def __getattr__(self, name):
        return torch.float64 if name == "bfloat16" else getattr(torch, name)


def matrix(rows, cols, f):
    return torch.tensor([[f(i, j) for j in range(cols)] for i in range(rows)],
                        dtype=torch.float64).to(torch.float32)


def torch_run(steps, nesterov, adjust, ns):
    params = [torch.nn.Parameter(matrix(r, c, lambda i, j, k=k: 0.5 * math.sin(1.3 * i + 0.7 * j + k)))
              for k, (r, c) in enumerate(SHAPES)]
    saved = muon_module.torch
    if ns == "f64":
        muon_module.torch = _F64Torch()
    try:
        opt = torch.optim.Muon(params, lr=0.02, nesterov=nesterov, adjust_lr_fn=adjust)
        for t in range(steps):
            for k, p in enumerate(params):
                r, c = p.shape
                p.grad = matrix(r, c, lambda i, j: math.cos(0.9 * i - 1.1 * j + 0.5 * t + k))
            opt.step()
    finally:
        muon_module.torch = saved
    out = {}
    for k, p in enumerate(params):
        out[f"param {k}"] = p.detach().flatten().tolist()
        out[f"momentum {k}"] = opt.state[p]["momentum_buffer"].flatten().tolist()
    return out


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def ordered(b):  # f32 bits to an integer order in which neighbours differ by one
    return b if b < 0x80000000 else 0x80000000 - b


def tapegrad_run(binary, steps, nesterov, adjust, ns):
    text = subprocess.run([binary, str(steps), "1" if nesterov else "0", adjust, ns],
                          check=True, capture_output=True, text=True).stdout
    out = {}
    for line in text.splitlines():
        words = line.split()
        out[f"{words[0]} {words[1]}"] = [int(w, 16) for w in words[2:]]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--fingerprint", action="store_true",
                        help="print the FNV-1a fingerprints muon_test.cc pins (f64 iteration)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.fingerprint:
        for nesterov, adjust in ((True, "original"), (False, "match_rms_adamw")):
            ref = torch_run(args.steps, nesterov, adjust, "f64")
            h = 14695981039346656037
            for key in ("param 0", "momentum 0", "param 1", "momentum 1"):
                for v in ref[key]:
                    for byte in struct.pack("<f", v):
                        h = ((h ^ byte) * 1099511628211) % (1 << 64)
            print(f"nesterov {int(nesterov)} {adjust}: 0x{h:016x}")
        return
    print(f"torch {torch.__version__}, {args.steps} steps")
    for ns in ("f64", "bf16"):
        for nesterov in (True, False):
            for adjust in ("original", "match_rms_adamw"):
                ref = torch_run(args.steps, nesterov, adjust, ns)
                got = tapegrad_run(args.binary, args.steps, nesterov, adjust, ns)
                parts = []
                for key, values in ref.items():
                    want = [bits(v) for v in values]
                    differ = [abs(ordered(a) - ordered(b)) for a, b in zip(want, got[key]) if a != b]
                    mine = [struct.unpack("<f", struct.pack("<I", b))[0] for b in got[key]]
                    abs_diff = max(abs(a - b) for a, b in zip(values, mine))
                    scale = max(abs(a) for a in values)
                    parts.append(f"{key}: {len(differ)}/{len(want)} differ"
                                 + (f" (max {max(differ)} ulp, {abs_diff:.2g} of max |x| {scale:.2g})"
                                    if differ else ""))
                print(f"ns {ns:4} nesterov {int(nesterov)} {adjust:15}: " + "; ".join(parts))


if __name__ == "__main__":
    main()
