#!/usr/bin/env python3
"""Prints the parameters torch.optim.Muon (torch 2.15) reaches from fixed inputs, as the
literals of tests/optim/muon_test.cc.

  ~/.cache/tapegrad/torch-venv/bin/python tests/optim/muon_reference.py

Two parameters, [3, 5] (wide) and [6, 4] (tall, so the iteration runs on its transpose), start at
p[i][j] = 0.5 sin(1.3 i + 0.7 j + k) (k: the parameter's number) and take 3 steps with the
gradients g_t[i][j] = cos(0.9 i - 1.1 j + 0.5 t + k). The f64 cases run torch's own code with its
bf16 iteration dtype replaced by f64 (its module's `torch.bfloat16` read as `torch.float64`), so
the algorithm is compared to 1e-12; the bf16 case is torch.optim.Muon unchanged, on f32
parameters.
"""
import math

import torch
import torch.optim._muon as muon_module

SHAPES = [(3, 5), (6, 4)]
STEPS = 3


class _F64Torch:
    """The torch module, except that bfloat16 is float64."""

    def __getattr__(self, name):
        return torch.float64 if name == "bfloat16" else getattr(torch, name)


def run(dtype, f64_iteration, **options):
    params = []
    for k, (r, c) in enumerate(SHAPES):
        p = torch.tensor([[0.5 * math.sin(1.3 * i + 0.7 * j + k) for j in range(c)]
                          for i in range(r)], dtype=torch.float64).to(dtype)
        params.append(torch.nn.Parameter(p))
    saved = muon_module.torch
    if f64_iteration:
        muon_module.torch = _F64Torch()
    try:
        opt = torch.optim.Muon(params, **options)
        for t in range(STEPS):
            for k, p in enumerate(params):
                r, c = p.shape
                p.grad = torch.tensor([[math.cos(0.9 * i - 1.1 * j + 0.5 * t + k) for j in range(c)]
                                       for i in range(r)], dtype=torch.float64).to(dtype)
            opt.step()
    finally:
        muon_module.torch = saved
    return [p.detach().to(torch.float64).flatten().tolist() for p in params]


CASES = [
    ("DefaultsF64", torch.float64, True, dict(lr=0.02)),
    ("PlainMomentumMatchRmsAdamWF64", torch.float64, True,
     dict(lr=0.01, momentum=0.9, nesterov=False, weight_decay=0.01,
          adjust_lr_fn="match_rms_adamw")),
    ("SpectralUnclampedTwoStepsF64", torch.float64, True,
     dict(lr=0.05, adjust_lr_fn="spectral_unclamped", ns_steps=2, eps=1e-3)),
    ("DefaultsBf16IterationF32Params", torch.float32, False, dict(lr=0.02)),
]

print(f"// torch {torch.__version__}, tests/optim/muon_reference.py")
for name, dtype, f64_iteration, options in CASES:
    got = run(dtype, f64_iteration, **options)
    print(f"// {name}: {options}")
    print(f"const std::vector<std::vector<double>> k{name} = {{")
    for values in got:
        line = "    {"
        for n, v in enumerate(values):
            item = repr(v) + ("}," if n + 1 == len(values) else ",")
            if len(line) + 1 + len(item) > 100:
                print(line)
                line = "     " + item
            else:
                line += ("" if line.endswith("{") else " ") + item
        print(line)
    print("};")
