#!/usr/bin/env python3
"""Runs torch's Muon, Adam and AdamW (torch 2.15, CPU) and tapegrad's (tests/optim:torch_trace) for
the same steps from the same f32 inputs and compares their parameters and optimizer state bit for
bit:

  bazel build -c opt //tests/optim:torch_trace
  ~/.cache/tapegrad/torch-venv/bin/python tests/optim/torch_trace_compare.py \\
      bazel-bin/tests/optim/torch_trace --steps 1000

Muon: Nesterov on and off, the original and match_rms_adamw learning rates, and the bf16
iteration (torch's) and an f64 one (torch's code with its bf16 read as f64, as muon_reference.py
does). Adam and AdamW (lr 0.01, weight decay 0 and 0.1, amsgrad off and on, foreach=False: torch's
CPU default): with torch's own square root, and with it replaced by the correctly rounded one
("ieee"), since torch's CPU f32 sqrt is not correctly rounded (up to 0.75 ulp) and tapegrad's is.

Inputs (tests/optim/torch_trace_inputs.h): a [16, 40] and a [48, 24] parameter at p[i][j] =
0.5 sin(1.3 i + 0.7 j + k), gradients g_t[i][j] = cos(0.9 i - 1.1 j + 0.5 t + k), both computed
in f64 and rounded to f32. Prints, per case and tensor, how many elements differ and the largest
difference in f32 ulps and in value; --fingerprint prints the FNV-1a fingerprints muon_test.cc and
adam_test.cc pin. A manual check (torch is not needed by the build or the tests).
"""
import argparse
import contextlib
import math
import struct
import subprocess

import numpy as np
import torch
import torch.optim._muon as muon_module

SHAPES = [(16, 40), (48, 24)]


class _F64Torch:
    def __getattr__(self, name):
        return torch.float64 if name == "bfloat16" else getattr(torch, name)


def matrix(rows, cols, f):
    return torch.tensor([[f(i, j) for j in range(cols)] for i in range(rows)],
                        dtype=torch.float64).to(torch.float32)


@contextlib.contextmanager
def muon_iteration(ns):
    saved = muon_module.torch
    if ns == "f64":
        muon_module.torch = _F64Torch()
    try:
        yield
    finally:
        muon_module.torch = saved


def _ieee_sqrt(self):
    # numpy's f64 sqrt is correctly rounded, and rounding it to f32 gives the correctly rounded
    # f32 sqrt (53 >= 2 * 24 + 2 bits).
    return torch.from_numpy(np.sqrt(self.detach().numpy().astype(np.float64)).astype(np.float32))


@contextlib.contextmanager
def sqrt_kind(kind):
    saved = torch.Tensor.sqrt
    if kind == "ieee":
        torch.Tensor.sqrt = _ieee_sqrt
    try:
        yield
    finally:
        torch.Tensor.sqrt = saved


def torch_run(steps, case):
    params = [torch.nn.Parameter(matrix(r, c, lambda i, j, k=k: 0.5 * math.sin(1.3 * i + 0.7 * j + k)))
              for k, (r, c) in enumerate(SHAPES)]
    if case[0] == "muon":
        _, nesterov, adjust, ns = case
        opt = torch.optim.Muon(params, lr=0.02, nesterov=nesterov, adjust_lr_fn=adjust)
        context = muon_iteration(ns)
    else:
        kind, weight_decay, amsgrad, sqrt = case
        cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
        opt = cls(params, lr=0.01, weight_decay=weight_decay, amsgrad=amsgrad, foreach=False)
        context = sqrt_kind(sqrt)
    with context:
        for t in range(steps):
            for k, p in enumerate(params):
                r, c = p.shape
                p.grad = matrix(r, c, lambda i, j: math.cos(0.9 * i - 1.1 * j + 0.5 * t + k))
            opt.step()
    out = {}
    for k, p in enumerate(params):
        out[f"param {k}"] = p.detach().flatten().tolist()
        for name, value in sorted(opt.state[p].items()):
            if name != "step":
                out[f"{name} {k}"] = value.flatten().tolist()
    return out


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def ordered(b):  # f32 bits to an integer order in which neighbours differ by one
    return b if b < 0x80000000 else 0x80000000 - b


def tapegrad_run(binary, steps, case):
    if case[0] == "muon":
        _, nesterov, adjust, ns = case
        args = ["muon", str(steps), "1" if nesterov else "0", adjust, ns]
    else:
        kind, weight_decay, amsgrad, _ = case
        args = [kind, str(steps), repr(weight_decay), "1" if amsgrad else "0"]
    text = subprocess.run([binary] + args, check=True, capture_output=True, text=True).stdout
    out = {}
    for line in text.splitlines():
        words = line.split()
        out[f"{words[0]} {words[1]}"] = [int(w, 16) for w in words[2:]]
    return out


def fingerprint(values_by_key, keys):
    h = 14695981039346656037
    for key in keys:
        for v in values_by_key[key]:
            for byte in struct.pack("<f", v):
                h = ((h ^ byte) * 1099511628211) % (1 << 64)
    return h


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary", nargs="?")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--fingerprint", action="store_true",
                        help="print the fingerprints muon_test.cc (f64 iteration) and adam_test.cc "
                             "(ieee sqrt) pin")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.fingerprint:
        for nesterov, adjust in ((True, "original"), (False, "match_rms_adamw")):
            ref = torch_run(args.steps, ("muon", nesterov, adjust, "f64"))
            h = fingerprint(ref, ("param 0", "momentum_buffer 0", "param 1", "momentum_buffer 1"))
            print(f"muon nesterov {int(nesterov)} {adjust}: 0x{h:016x}")
        for kind, weight_decay, amsgrad in (("adamw", 0.1, False), ("adam", 0.1, True)):
            ref = torch_run(args.steps, (kind, weight_decay, amsgrad, "ieee"))
            keys = [key for k in (0, 1) for key in sorted(ref) if key.endswith(f" {k}")]
            print(f"{kind} weight_decay {weight_decay} amsgrad {int(amsgrad)} "
                  f"({', '.join(keys)}): 0x{fingerprint(ref, keys):016x}")
        return
    if args.binary is None:
        parser.error("the torch_trace binary is needed unless --fingerprint")
    print(f"torch {torch.__version__}, {args.steps} steps")
    cases = [("muon", nesterov, adjust, ns) for ns in ("f64", "bf16") for nesterov in (True, False)
             for adjust in ("original", "match_rms_adamw")]
    cases += [(kind, weight_decay, amsgrad, sqrt) for sqrt in ("ieee", "torch")
              for kind in ("adamw", "adam") for weight_decay in (0.0, 0.1)
              for amsgrad in (False, True)]
    for case in cases:
        ref = torch_run(args.steps, case)
        got = tapegrad_run(args.binary, args.steps, case)
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
        if case[0] == "muon":
            label = f"muon ns {case[3]:4} nesterov {int(case[1])} {case[2]:15}"
        else:
            label = f"{case[0]:5} wd {case[1]} amsgrad {int(case[2])} sqrt {case[3]:5}"
        print(f"{label}: " + "; ".join(parts))


if __name__ == "__main__":
    main()
