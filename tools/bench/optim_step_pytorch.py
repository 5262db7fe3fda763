#!/usr/bin/env python3
"""PyTorch's fused AdamW (torch.optim.AdamW(fused=True)) on the parameters of
tools/bench/optim_step.cc: 10^7 f32 parameters in 19 tensors (9 x [1000, 1000], 10 x [100000]),
lr 1e-4, weight decay 0.1, best of 10 steps after one warm-up; and torch.optim.Muon (lr 0.02, its
defaults) on its 8 matrices (4 x [256, 256], 4 x [256, 1024]). Writes JSON lines that
`optim_step --pytorch_json=FILE` reads:
  {"optimizer": "adamw_fused", "threads": 2, "ms_per_step": 6.1, "torch": "2.15.0"}
  {"optimizer": "muon", "threads": 2, "ms_per_step": 3.2, "torch": "2.15.0"}

  py=$(tools/bench/setup_pytorch_venv.sh | tail -1)
  $py tools/bench/optim_step_pytorch.py --threads 2 --out /tmp/adamw.jsonl
  OMP_NUM_THREADS=2 bazel-bin/tools/bench/optim_step --pytorch_json=/tmp/adamw.jsonl
"""
import argparse
import json
import time

import torch


def best_ms(opt):
    opt.step()
    best = float("inf")
    for _ in range(10):
        start = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - start)
    return 1e3 * best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    shapes = [(1000, 1000)] * 9 + [(100000,)] * 10
    params = [torch.nn.Parameter(torch.randn(s, generator=gen) * 0.02) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    matrices = [torch.nn.Parameter(torch.randn(256, 256 if i < 4 else 1024, generator=gen) * 0.02)
                for i in range(8)]
    for p in matrices:
        p.grad = torch.randn(p.shape, generator=gen)
    with open(args.out, "w") as out:
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, fused=True)
            muon = torch.optim.Muon(matrices, lr=0.02)
            for name, o in (("adamw_fused", opt), ("muon", muon)):
                record = {"optimizer": name, "threads": threads, "ms_per_step": best_ms(o),
                          "torch": torch.__version__}
                print(json.dumps(record), flush=True)
                out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
